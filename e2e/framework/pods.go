package framework

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
)

// BusyboxPod returns a pod that runs command in the e2e busybox image once
// (restartPolicy Never). Callers add volumes, node selection and so on.
func BusyboxPod(name string, command ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64(1)),
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           ImageBusybox,
				ImagePullPolicy: corev1.PullNever,
				Command:         command,
			}},
		},
	}
}

// CreatePod creates pod in the test namespace.
func (f *Framework) CreatePod(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	pod = pod.DeepCopy()
	pod.Namespace = f.Namespace
	created, err := f.Client.CoreV1().Pods(f.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating pod %s/%s: %w", f.Namespace, pod.Name, err)
	}
	return created, nil
}

// WaitForPod polls pod name until done reports true or an error, at most
// PodStartTimeout (and no longer than ctx allows).
func (f *Framework) WaitForPod(ctx context.Context, name string, done func(*corev1.Pod) (bool, error)) (*corev1.Pod, error) {
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, pollInterval, PodStartTimeout, true, func(ctx context.Context) (bool, error) {
		p, err := f.Client.CoreV1().Pods(f.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		last = p
		return done(p)
	})
	if err != nil {
		state := "not found"
		if last != nil {
			state = podSummary(last)
		}
		return last, fmt.Errorf("pod %s/%s: %w (last seen: %s)", f.Namespace, name, err, state)
	}
	return last, nil
}

// WaitForPodPhase waits until the pod reaches phase. It gives up at once if
// the pod reaches another phase it cannot leave (Succeeded or Failed).
func (f *Framework) WaitForPodPhase(ctx context.Context, name string, phase corev1.PodPhase) (*corev1.Pod, error) {
	return f.WaitForPod(ctx, name, func(p *corev1.Pod) (bool, error) {
		if p.Status.Phase == phase {
			return true, nil
		}
		if slices.Contains([]corev1.PodPhase{corev1.PodSucceeded, corev1.PodFailed}, p.Status.Phase) {
			return false, fmt.Errorf("pod ended in phase %s, want %s", p.Status.Phase, phase)
		}
		return false, nil
	})
}

func podSummary(p *corev1.Pod) string {
	parts := []string{"phase " + string(p.Status.Phase)}
	if p.Spec.NodeName != "" {
		parts = append(parts, "node "+p.Spec.NodeName)
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			parts = append(parts, fmt.Sprintf("%s: %s", c.Type, c.Message))
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		parts = append(parts, fmt.Sprintf("container %s %s", cs.Name, describeState(cs.State)))
	}
	return strings.Join(parts, "; ")
}

// PodLogs returns the logs of one container of a pod, through the API
// server and the kubelet, as `kubectl logs` does.
func (f *Framework) PodLogs(ctx context.Context, pod, container string) (string, error) {
	rc, err := f.Client.CoreV1().Pods(f.Namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container}).Stream(ctx)
	if err != nil {
		return "", fmt.Errorf("logs of %s/%s container %s: %w", f.Namespace, pod, container, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return "", fmt.Errorf("logs of %s/%s container %s: %w", f.Namespace, pod, container, err)
	}
	return string(b), nil
}

// Exec runs command in a running container, as `kubectl exec` does, and
// returns its standard output and error. A non-zero exit is an error.
func (f *Framework) Exec(ctx context.Context, pod, container string, command ...string) (stdout, stderr string, err error) {
	req := f.Client.CoreV1().RESTClient().Post().
		Resource("pods").Namespace(f.Namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: container,
			Command:   command,
			Stdout:    true,
			Stderr:    true,
		}, scheme.ParameterCodec)
	exec, err := remotecommand.NewWebSocketExecutor(f.Config, "POST", req.URL().String())
	if err != nil {
		return "", "", fmt.Errorf("exec in %s/%s: %w", f.Namespace, pod, err)
	}
	var out, errOut bytes.Buffer
	err = exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut})
	if err != nil {
		return out.String(), errOut.String(), fmt.Errorf("exec %q in %s/%s: %w (stderr: %s)", command, f.Namespace, pod, err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), errOut.String(), nil
}
