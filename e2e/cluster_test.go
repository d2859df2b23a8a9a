//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/layercache/layercache/e2e/framework"
)

// TestClusterIsReal proves the harness runs a real cluster: the scheduler
// places a pod, the kubelet and containerd run it in a container, its write
// to a hostPath lands on the node's filesystem, and logs and exec work
// through the API server and the kubelet.
func TestClusterIsReal(t *testing.T) {
	f := framework.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	nodes, err := f.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != len(f.Cluster.Nodes) {
		t.Fatalf("API server lists %d nodes, the harness started %d (%v)", len(nodes.Items), len(f.Cluster.Nodes), f.Cluster.NodeNames())
	}
	for _, n := range nodes.Items {
		if !nodeReady(n) {
			t.Fatalf("node %s is not Ready: %+v", n.Name, n.Status.Conditions)
		}
	}

	node := f.Cluster.Nodes[0]
	dir := "/tmp/" + f.Namespace
	t.Cleanup(func() {
		if _, err := f.Cluster.NodeExec(context.Background(), node, "rm", "-rf", dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	pod := framework.BusyboxPod("writer", "sh", "-c",
		`echo "written by $(hostname)" > /out/hello && echo "wrote /out/hello"`)
	pod.Spec.NodeName = node.Name
	pod.Spec.Volumes = []corev1.Volume{{
		Name: "out",
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
			Path: dir, Type: new(corev1.HostPathDirectoryOrCreate),
		}},
	}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "out", MountPath: "/out"}}
	if _, err := f.CreatePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WaitForPodPhase(ctx, pod.Name, corev1.PodSucceeded); err != nil {
		t.Fatal(err)
	}

	// The hostname is the pod's: the command ran in the pod's UTS namespace,
	// i.e. in a container, and wrote through the hostPath onto the node.
	want := "written by writer\n"
	got, err := f.Cluster.ReadNodeFile(ctx, node, filepath.Join(dir, "hello"))
	if err != nil {
		t.Fatalf("the pod's file is not on node %s: %v", node.Name, err)
	}
	if string(got) != want {
		t.Errorf("node file %s/hello = %q, want %q", dir, got, want)
	}
	if f.Cluster.Backend == "local" {
		// The local nodes share this host's disk: the file is right here.
		got, err := os.ReadFile(filepath.Join(dir, "hello"))
		if err != nil || string(got) != want {
			t.Errorf("host file %s/hello = %q, %v; want %q", dir, got, err, want)
		}
	}

	logs, err := f.PodLogs(ctx, pod.Name, "main")
	if err != nil {
		t.Fatal(err)
	}
	if logs != "wrote /out/hello\n" {
		t.Errorf("logs = %q, want %q", logs, "wrote /out/hello\n")
	}

	sleeper := framework.BusyboxPod("sleeper", "sleep", "3600")
	sleeper.Spec.NodeName = node.Name
	if _, err := f.CreatePod(ctx, sleeper); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WaitForPodPhase(ctx, sleeper.Name, corev1.PodRunning); err != nil {
		t.Fatal(err)
	}
	stdout, _, err := f.Exec(ctx, sleeper.Name, "main", "cat", "/etc/hostname")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(stdout) != "sleeper" {
		t.Errorf("exec cat /etc/hostname = %q, want sleeper", stdout)
	}
}

// TestNodesHaveOwnLayercacheRoot checks what cross-node tests rely on: each
// node sees its own /var/lib/layercache, and the host sees it at the node's
// HostRoot.
func TestNodesHaveOwnLayercacheRoot(t *testing.T) {
	f := framework.NewAcrossNodes(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	marker := ".e2e-" + f.Namespace
	for _, node := range f.Cluster.Nodes {
		pod := framework.BusyboxPod("mark-"+node.Name, "sh", "-c", "echo "+node.Name+" > /root/"+marker)
		pod.Spec.NodeName = node.Name
		pod.Spec.Volumes = []corev1.Volume{{
			Name: "root",
			VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: "/var/lib/layercache", Type: new(corev1.HostPathDirectory),
			}},
		}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "root", MountPath: "/root"}}
		if _, err := f.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := f.Cluster.NodeExec(context.Background(), node, "rm", "-f", "/var/lib/layercache/"+marker); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
	}
	for _, node := range f.Cluster.Nodes {
		if _, err := f.WaitForPodPhase(ctx, "mark-"+node.Name, corev1.PodSucceeded); err != nil {
			t.Fatal(err)
		}
	}
	// All nodes wrote the same file name: each must read back its own.
	for _, node := range f.Cluster.Nodes {
		want := node.Name + "\n"
		got, err := f.Cluster.ReadNodeFile(ctx, node, "/var/lib/layercache/"+marker)
		if err != nil || string(got) != want {
			t.Errorf("node %s: /var/lib/layercache/%s = %q, %v; want %q", node.Name, marker, got, err, want)
		}
		if f.Cluster.Backend == "local" {
			file := filepath.Join(node.HostRoot, marker)
			if got, err := os.ReadFile(file); err != nil || string(got) != want {
				t.Errorf("node %s: host file %s = %q, %v; want %q", node.Name, file, got, err, want)
			}
		}
	}
}

func nodeReady(n corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestBidirectionalMountPropagation checks what the node agent relies on:
// a mount made by a privileged container below /var/lib/layercache with
// Bidirectional propagation is seen by the node (so the kubelet can hand it
// to other pods), by another pod, and by the host at the node's HostRoot.
func TestBidirectionalMountPropagation(t *testing.T) {
	f := framework.NewAcrossNodes(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	for _, node := range f.Cluster.Nodes {
		t.Run(node.Name, func(t *testing.T) {
			dir := ".e2e-mnt-" + f.Namespace
			t.Cleanup(func() {
				ctx := context.Background()
				_, _ = f.Cluster.NodeExec(ctx, node, "sh", "-c", "umount -l /var/lib/layercache/"+dir+" 2>/dev/null; rmdir /var/lib/layercache/"+dir+" 2>/dev/null; true")
			})

			mounter := framework.BusyboxPod("mounter-"+node.Name, "sh", "-c",
				"mkdir -p /root/"+dir+" && mount -t tmpfs e2e /root/"+dir+" && echo "+node.Name+" > /root/"+dir+"/f && exec sleep 3600")
			mounter.Spec.NodeName = node.Name
			bidirectional := corev1.MountPropagationBidirectional
			mounter.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: new(true)}
			mounter.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "root", MountPath: "/root", MountPropagation: &bidirectional}}
			mounter.Spec.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/layercache", Type: new(corev1.HostPathDirectory)},
			}}}
			if _, err := f.CreatePod(ctx, mounter); err != nil {
				t.Fatal(err)
			}
			if _, err := f.WaitForPodPhase(ctx, mounter.Name, corev1.PodRunning); err != nil {
				t.Fatal(err)
			}

			// A second, unprivileged pod gets the mounted directory from the
			// kubelet as a plain hostPath, as workloads get their volumes.
			reader := framework.BusyboxPod("reader-"+node.Name, "cat", "/cache/f")
			reader.Spec.NodeName = node.Name
			reader.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cache", MountPath: "/cache"}}
			reader.Spec.Volumes = []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/layercache/" + dir, Type: new(corev1.HostPathDirectory)},
			}}}
			if _, err := f.CreatePod(ctx, reader); err != nil {
				t.Fatal(err)
			}
			if _, err := f.WaitForPodPhase(ctx, reader.Name, corev1.PodSucceeded); err != nil {
				t.Fatal(err)
			}
			if logs, err := f.PodLogs(ctx, reader.Name, "main"); err != nil || logs != node.Name+"\n" {
				t.Errorf("reader saw %q, %v; want %q from the mounter's tmpfs", logs, err, node.Name+"\n")
			}

			if f.Cluster.Backend == "local" {
				hostDir := filepath.Join(node.HostRoot, dir)
				mounts, err := os.ReadFile("/proc/self/mountinfo")
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(string(mounts), " "+hostDir+" ") {
					t.Errorf("the host does not see the pod's mount at %s", hostDir)
				}
			}

			if _, _, err := f.Exec(ctx, mounter.Name, "main", "umount", "/root/"+dir); err != nil {
				t.Errorf("unmounting in the pod: %v", err)
			}
		})
	}
}
