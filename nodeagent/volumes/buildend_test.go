package volumes

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

func TestShouldCommit(t *testing.T) {
	tests := []struct {
		mode    v1alpha1.Mode
		commit  v1alpha1.CommitPolicy
		outcome string
		want    bool
	}{
		{"write", "on-success", "succeeded", true},
		{"write", "on-success", "failed", false},
		{"write", "on-success", "", false},
		{"write", "always", "succeeded", true},
		{"write", "always", "failed", true},
		{"write", "always", "", true},
		{"write", "never", "succeeded", false},
		{"write", "never", "", false},
		{"read", "always", "succeeded", false},
		{"read", "on-success", "succeeded", false},
	}
	for _, tt := range tests {
		p := provisioned{Mode: tt.mode, Commit: tt.commit, Outcome: tt.outcome}
		if got := p.shouldCommit(); got != tt.want {
			t.Errorf("mode %s, commit %s, outcome %q: shouldCommit = %v, want %v", tt.mode, tt.commit, tt.outcome, got, tt.want)
		}
	}
}

// TestDiscardWhyNamesMarkers pins the marker paths in the Discarded Event:
// users write them from the volume's root, so the Event names them so.
func TestDiscardWhyNamesMarkers(t *testing.T) {
	tests := []struct {
		marker marker
		want   string
	}{
		{markerNone, "its build did not write .layercache/commit and the commit policy is on-marker"},
		{markerAbort, "its build wrote .layercache/abort and the commit policy is on-marker"},
	}
	for _, tt := range tests {
		p := provisioned{Mode: "write", Commit: "on-marker", Marker: tt.marker}
		if got := p.discardWhy(); got != tt.want {
			t.Errorf("marker %d: discardWhy = %q, want %q", tt.marker, got, tt.want)
		}
	}
}

// releasedPV provisions a claim and returns its PV as the manager leaves it
// at release: with the pod's outcome recorded.
func releasedPV(t *testing.T, env *testEnv, ann map[string]string, outcome string) *corev1.PersistentVolume {
	t.Helper()
	opts := provisionOptions("ci", ann, nil)
	pv, _, err := env.prov.Provision(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if outcome != "" {
		pv.Annotations[v1alpha1.AnnotationPodOutcome] = outcome
	}
	pv.Status.Phase = corev1.VolumeReleased
	env.drainEvents()
	return pv
}

func TestDeleteCommitsOrDiscards(t *testing.T) {
	tests := []struct {
		name       string
		ann        map[string]string
		outcome    string
		wantCommit bool
		wantEvent  string
	}{
		{"succeeded pod", map[string]string{v1alpha1.AnnotationCache: "maven"}, "succeeded", true, "Normal Committed"},
		{"failed pod", map[string]string{v1alpha1.AnnotationCache: "maven"}, "failed", false, "Normal Discarded"},
		{"unknown outcome", map[string]string{v1alpha1.AnnotationCache: "maven"}, "", false, "Normal Discarded"},
		{"failed pod, commit always", map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationCommit: "always"}, "failed", true, "Normal Committed"},
		{"unknown outcome, commit always", map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationCommit: "always"}, "", true, "Normal Committed"},
		{"commit never", map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationCommit: "never"}, "succeeded", false, "Normal Discarded"},
		{"read mode", map[string]string{v1alpha1.AnnotationCache: "maven", v1alpha1.AnnotationMode: "read", v1alpha1.AnnotationCommit: "always"}, "succeeded", false, "Normal Discarded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t, nil)
			pv := releasedPV(t, env, tt.ann, tt.outcome)
			if err := env.prov.Delete(context.Background(), pv); err != nil {
				t.Fatalf("Delete: %v", err)
			}
			committed := len(env.store.Commits) == 1
			discarded := len(env.store.Discards) == 1
			if committed != tt.wantCommit || committed == discarded {
				t.Errorf("commits %v discards %v, want commit=%v", env.store.Commits, env.store.Discards, tt.wantCommit)
			}
			env.wantEvent(t, tt.wantEvent, pv.Name)
			// A second Delete (the PV object's deletion failed, or the
			// agent restarted) finds the volume gone and succeeds.
			if err := env.prov.Delete(context.Background(), pv); err != nil {
				t.Errorf("second Delete: %v", err)
			}
			if len(env.store.Commits)+len(env.store.Discards) != 1 {
				t.Errorf("second Delete acted again: commits %v discards %v", env.store.Commits, env.store.Discards)
			}
		})
	}
}

func TestDeleteCommitFailureKeepsVolume(t *testing.T) {
	env := newTestEnv(t, nil)
	pv := releasedPV(t, env, map[string]string{v1alpha1.AnnotationCache: "maven"}, "succeeded")
	env.store.CommitErr = layerfs.ErrBusy

	err := env.prov.Delete(context.Background(), pv)
	if err == nil {
		t.Fatal("Delete succeeded although the commit failed; the library would delete the PV and strand the changes")
	}
	var ignored *controller.IgnoredError
	if errors.As(err, &ignored) {
		t.Fatal("a failed commit must be retried, not ignored")
	}
	env.wantEvent(t, "Warning CommitFailed", pv.Name, "retried", "kept")
	if _, ok := env.store.VolumeByID[pv.Name]; !ok {
		t.Fatal("volume gone after a failed commit")
	}
	if got := metricValue(t, env.prov.metrics.Failures.WithLabelValues("commit", "busy")); got != 1 {
		t.Errorf("failures{commit,busy} = %v, want 1", got)
	}

	env.store.CommitErr = nil
	if err := env.prov.Delete(context.Background(), pv); err != nil {
		t.Fatalf("retried Delete: %v", err)
	}
	if len(env.store.Commits) != 1 {
		t.Errorf("retry did not commit: %v", env.store.Commits)
	}
}

func TestDeleteQueuesSquash(t *testing.T) {
	env := newTestEnv(t, nil)
	env.store.MaxLayers = 0
	pv := releasedPV(t, env, map[string]string{v1alpha1.AnnotationCache: "maven"}, "succeeded")
	if err := env.prov.Delete(context.Background(), pv); err != nil {
		t.Fatal(err)
	}
	if n := env.prov.squashes.Queue.Len(); n != 1 {
		t.Errorf("squash queue has %d items after a commit that needs a squash, want 1", n)
	}
}

func TestDeleteEditedAnnotations(t *testing.T) {
	env := newTestEnv(t, nil)
	pv := releasedPV(t, env, map[string]string{v1alpha1.AnnotationCache: "maven"}, "succeeded")
	pv.Annotations[v1alpha1.AnnotationMode] = "rw"
	err := env.prov.Delete(context.Background(), pv)
	if err == nil || !strings.Contains(err.Error(), "restore it") {
		t.Fatalf("Delete with an edited mode: %v, want an error saying how to repair", err)
	}
	env.wantEvent(t, "Warning InvalidVolumeAnnotations", "layercache.dev/mode")
	if len(env.store.VolumeByID) != 1 {
		t.Error("a volume whose fate is unclear must be kept")
	}
}

// Issue 8, item 8: a volume torn by a crash is discarded, never committed,
// and the user is told why.
func TestDeleteOfTornVolume(t *testing.T) {
	env := newTestEnv(t, nil)
	pv := releasedPV(t, env, map[string]string{v1alpha1.AnnotationCache: "maven"}, v1alpha1.OutcomeSucceeded)
	env.store.Torn[pv.Name] = true
	if err := env.prov.Delete(context.Background(), pv); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if len(env.store.Commits) != 0 || len(env.store.Discards) != 1 {
		t.Errorf("commits %v discards %v, want the torn volume discarded", env.store.Commits, env.store.Discards)
	}
	env.wantEvent(t, "Warning CommitTorn", pv.Name, "may be torn", "discarded")
	if got := metricValue(t, env.prov.metrics.Ends.WithLabelValues(v1alpha1.ResultDiscarded, triggerRelease)); got != 1 {
		t.Errorf("volume ends discarded by release = %v, want 1", got)
	}
}

// Issue 8, item 2: where the store has no project quotas, a build that
// wrote more than its claim's request is discarded at commit, and told.
func TestDeleteOverLimit(t *testing.T) {
	env := newTestEnv(t, nil)
	pv := releasedPV(t, env, map[string]string{v1alpha1.AnnotationCache: "maven"}, v1alpha1.OutcomeSucceeded)
	env.store.Written[pv.Name] = 3 << 30 // the claim asked for 1Gi
	if err := env.prov.Delete(context.Background(), pv); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if len(env.store.Commits) != 0 || len(env.store.Discards) != 1 {
		t.Errorf("commits %v discards %v, want the volume discarded", env.store.Commits, env.store.Discards)
	}
	env.wantEvent(t, "Warning CommitOverLimit", pv.Name, "3.0GiB", "request more storage")
}
