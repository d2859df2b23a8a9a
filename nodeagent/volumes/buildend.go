package volumes

import (
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
	"github.com/layercache/layercache/nodeagent/kit"
)

// What ended a build, for the ends metric.
const (
	triggerPod     = "pod"
	triggerRelease = "release"
	// triggerUnpublish: the kubelet unpublished a CSI volume.
	triggerUnpublish = "unpublish"
)

// ended is what end did to a volume.
type ended struct {
	// Result is v1alpha1.ResultCommitted, ResultDiscarded or ResultDropped;
	// empty if the volume had already ended.
	Result     string
	Generation int64 // the cache's generation after a commit
	Outcome    string
}

// endCause is what ended a build, as end needs it.
type endCause struct {
	// Outcome is what the agent saw of the pods; "" to take the one
	// recorded on the PV.
	Outcome string
	Trigger string // triggerPod or triggerRelease
	// Subject is the object the Event goes on: the claim while it exists.
	Subject runtime.Object
}

// end commits or discards the volume of a build that ended, as its mode,
// its commit policy and the build's outcome say. A volume that is no
// longer in the store had already ended, and nothing is done.
func (p *Provisioner) end(ctx context.Context, pv *corev1.PersistentVolume, cause endCause) (ended, error) {
	rec, err := parsePV(pv)
	if err != nil {
		p.events.Eventf(pv, nil, corev1.EventTypeWarning, kit.ReasonInvalidVolume, kit.ActionEnd, "%s", err.Error())
		p.metrics.Fail(kit.OpCommit, kit.ReasonInvalidVolume)
		return ended{}, err
	}
	return p.endVolume(log.IntoContext(ctx, log.FromContext(ctx).WithValues("pv", pv.Name)), pv.Name, rec, cause)
}

// endVolume ends a volume of the store, of a PV or of a CSI volume, as
// rec says: one request to the store, which reads the build's markers,
// lets shouldCommit decide, and announces a commit with changes before
// it seals them.
func (p *Provisioner) endVolume(ctx context.Context, volume string, rec provisioned, cause endCause) (ended, error) {
	if cause.Outcome != "" {
		rec.Outcome = cause.Outcome
	}
	logger := log.FromContext(ctx).WithValues("cache", rec.Cache.String(), "mode", rec.Mode, "commit", rec.Commit, "outcome", rec.Outcome)
	start := time.Now()
	res, err := p.store.End(ctx, volume, layerfs.EndOptions{
		ControlFiles: rec.markerFiles(),
		Decide: func(written map[string]bool) bool {
			rec.Marker = markerOf(written)
			return rec.shouldCommit()
		},
		// Announced before the commit's seal, which takes seconds for a
		// large delta, so that a build starting on another node now
		// waits for it.
		BeforeSeal: func() { p.sync.Announce(ctx, rec.Cache, volume) },
	})
	if res.Announced && (err == nil || errors.Is(err, layerfs.ErrNotFound)) {
		p.sync.Committed(ctx, rec.Cache, volume, res.Commit.Layer != "")
	}
	switch {
	case errors.Is(err, layerfs.ErrNotFound):
		logger.Info("Volume already gone; nothing to end")
		return ended{}, nil
	case err != nil:
		return ended{}, p.endFailed(volume, rec, res, cause.Subject, err)
	}
	var out ended
	if res.Kept {
		p.metrics.CommitSeconds.Observe(time.Since(start).Seconds())
		out = p.committed(logger, volume, rec, res.Commit, cause.Subject)
	} else {
		out = p.discarded(logger, volume, rec, res.FailedRead, cause.Subject)
	}
	out.Outcome = rec.Outcome
	p.metrics.Ends.WithLabelValues(out.Result, cause.Trigger).Inc()
	if at, ok := kit.QueuedAt(ctx); ok && cause.Trigger == triggerPod {
		p.metrics.EndDelay.Observe(time.Since(at).Seconds())
	}
	p.reports.Add(rec.Cache)
	return out, nil
}

// markerFiles are the control files whose presence decides the volume's
// fate: the build's markers, under on-marker only.
func (p provisioned) markerFiles() []string {
	if p.Commit != v1alpha1.CommitOnMarker || p.Mode != v1alpha1.ModeWrite {
		return nil
	}
	return []string{v1alpha1.MarkerAbort, v1alpha1.MarkerCommit}
}

// markerOf is what the build said: an abort wins over a commit.
func markerOf(written map[string]bool) marker {
	switch {
	case written[v1alpha1.MarkerAbort]:
		return markerAbort
	case written[v1alpha1.MarkerCommit]:
		return markerCommit
	}
	return markerNone
}

// endFailed reports an end that failed; the store kept the volume and
// its changes, and the caller retries with backoff.
func (p *Provisioner) endFailed(volume string, rec provisioned, res layerfs.EndResult, subject runtime.Object, err error) error {
	switch {
	case res.Kept:
		reason := "error"
		if errors.Is(err, layerfs.ErrBusy) {
			reason = "busy"
		}
		p.metrics.Fail(kit.OpCommit, reason)
		msg := fmt.Sprintf("commit of volume %s into cache %s failed and is retried; the volume's changes are kept: %v", volume, rec.Cache, err)
		p.events.Eventf(subject, nil, corev1.EventTypeWarning, kit.ReasonCommitFailed, kit.ActionCommit, "%s", msg)
		return fmt.Errorf("commit volume %s into cache %s: %w", volume, rec.Cache, err)
	case res.Written != nil: // decided: a discard failed
		p.metrics.Fail(kit.OpDiscard, "error")
		p.events.Eventf(subject, nil, corev1.EventTypeWarning, kit.ReasonDiscardFailed, kit.ActionDiscard, "discarding volume %s failed and is retried: %v", volume, err)
		return fmt.Errorf("discard volume %s of cache %s: %w", volume, rec.Cache, err)
	}
	return fmt.Errorf("end volume %s of cache %s: %w", volume, rec.Cache, err)
}

// committed reports what a commit did.
func (p *Provisioner) committed(logger logr.Logger, volume string, rec provisioned, res layerfs.CommitResult, subject runtime.Object) ended {
	out := ended{Result: v1alpha1.ResultCommitted, Generation: res.Generation}
	switch {
	case res.Torn:
		out = ended{Result: v1alpha1.ResultDiscarded}
		p.events.Eventf(subject, nil, corev1.EventTypeWarning, kit.ReasonCommitTorn, kit.ActionCommit,
			"node %s went down while volume %s was mounted; its changes were written without syncs and may be torn, so they were discarded and cache %s stays at generation %d",
			p.node, volume, rec.Cache, res.Generation)
	case res.OverLimit:
		out = ended{Result: v1alpha1.ResultDiscarded}
		p.events.Eventf(subject, nil, corev1.EventTypeWarning, kit.ReasonCommitOverLimit, kit.ActionCommit,
			"volume %s's changes take %s, more than its claim's storage request, so they were discarded and cache %s stays at generation %d; request more storage in the claim",
			volume, v1alpha1.FormatSize(res.Bytes), rec.Cache, res.Generation)
	case res.Dropped:
		out = ended{Result: v1alpha1.ResultDropped}
		p.events.Eventf(subject, nil, corev1.EventTypeNormal, kit.ReasonCommitDropped, kit.ActionCommit,
			"cache %s was deleted while volume %s used it, so the volume's changes were dropped", rec.Cache, volume)
	case res.Layer == "":
		p.events.Eventf(subject, nil, corev1.EventTypeNormal, kit.ReasonCommitted, kit.ActionCommit,
			"volume %s had no changes; cache %s stays at generation %d", volume, rec.Cache, res.Generation)
	default:
		p.events.Eventf(subject, nil, corev1.EventTypeNormal, kit.ReasonCommitted, kit.ActionCommit,
			"committed volume %s as generation %d of cache %s (%d bytes)", volume, res.Generation, rec.Cache, res.Bytes)
	}
	logger.Info("Committed", "generation", res.Generation, "layer", res.Layer, "bytes", res.Bytes, "dropped", res.Dropped, "torn", res.Torn, "overLimit", res.OverLimit)
	if res.NeedsSquash {
		p.squashes.Add(rec.Cache)
	}
	if res.Layer != "" {
		// A cache without a registry costs the publisher one read.
		p.sync.QueuePublish(rec.Cache)
	}
	return out
}

// discarded reports a discard; failedRead, if set, is why the store
// discarded a volume whatever its policy said.
func (p *Provisioner) discarded(logger logr.Logger, volume string, rec provisioned, failedRead string, subject runtime.Object) ended {
	why, typ := rec.discardWhy(), corev1.EventTypeNormal
	if failedRead != "" {
		why = failedRead + ", so what the build wrote may rest on read errors and is not committed; the registry of cache " + rec.Cache.String() + " must be reachable while builds read layers fetched on demand (or set the class's mountFirst to \"false\")"
		typ = corev1.EventTypeWarning
	}
	p.events.Eventf(subject, nil, typ, kit.ReasonDiscarded, kit.ActionDiscard, "discarded volume %s: %s", volume, why)
	logger.Info("Discarded", "why", why)
	return ended{Result: v1alpha1.ResultDiscarded}
}

// marker is what a build said through its volume's control directory.
type marker int

const (
	markerNone   marker = iota // no v1alpha1.MarkerCommit
	markerCommit               // v1alpha1.MarkerCommit and no MarkerAbort
	markerAbort                // v1alpha1.MarkerAbort, whatever else
)

// markerPath is where a build writes a marker, from the volume's root.
func markerPath(name string) string {
	return path.Join(layerfs.ControlDir, name)
}

// shouldCommit decides the fate of a volume whose build ended: only
// writable volumes are committed, and only when the policy accepts the
// pods' outcome, or under on-marker the build's marker. An unknown outcome
// is committed only under "always".
func (p provisioned) shouldCommit() bool {
	if p.Mode != v1alpha1.ModeWrite {
		return false
	}
	switch p.Commit {
	case v1alpha1.CommitAlways:
		return true
	case v1alpha1.CommitOnSuccess:
		return p.Outcome == v1alpha1.OutcomeSucceeded
	case v1alpha1.CommitOnMarker:
		return p.Marker == markerCommit
	}
	return false
}

// discardWhy explains to a user why a volume's changes were not kept.
func (p provisioned) discardWhy() string {
	switch {
	case p.Mode == v1alpha1.ModeRead:
		return "it was a read-only view of cache " + p.Cache.String()
	case p.Commit == v1alpha1.CommitNever:
		return "its commit policy is never"
	case p.Commit == v1alpha1.CommitOnMarker && p.Marker == markerAbort:
		return "its build wrote " + markerPath(v1alpha1.MarkerAbort) + " and the commit policy is " + string(v1alpha1.CommitOnMarker)
	case p.Commit == v1alpha1.CommitOnMarker:
		return "its build did not write " + markerPath(v1alpha1.MarkerCommit) + " and the commit policy is " + string(v1alpha1.CommitOnMarker)
	case p.Outcome == v1alpha1.OutcomeFailed:
		return "its pod failed and the commit policy is " + string(p.Commit)
	default:
		return "its pod's outcome is unknown and the commit policy is " + string(p.Commit) + " (only always commits without a known outcome)"
	}
}
