package nodeagent

import "fmt"

// Event reasons; they double as the reason label of the failures metric
// (lower-cased), so keep the set small and fixed.
const (
	reasonInvalidAnnotation   = "InvalidAnnotation"
	reasonInvalidAttribute    = "InvalidVolumeAttributes"
	reasonRegistryCache       = "RegistryCacheNotInline"
	reasonCSINotEnabled       = "CSINotEnabled"
	reasonInvalidStorageClass = "InvalidStorageClass"
	reasonCacheTemplate       = "CacheTemplateFailed"
	reasonCacheAccessDenied   = "CacheAccessDenied"
	reasonCacheDeleting       = "CacheDeleting"
	reasonModeForcedRead      = "ModeForcedRead"
	reasonMountFailed         = "MountFailed"
	reasonCommitted           = "Committed"
	reasonCommitDropped       = "CommitDropped"
	reasonCommitTorn          = "CommitTorn"
	reasonCommitOverLimit     = "CommitOverLimit"
	reasonDiscarded           = "Discarded"
	reasonCommitFailed        = "CommitFailed"
	reasonDiscardFailed       = "DiscardFailed"
	reasonInvalidVolume       = "InvalidVolumeAnnotations"
	reasonRemountFailed       = "RemountFailed"
	reasonRetention           = "RetentionExceeded"
	reasonSeeded              = "SeededFromFallback"
	reasonFallbackIgnored     = "FallbackIgnored"
)

// Event reasons of registry sync.
const (
	reasonSyncIncomplete     = "SyncIncomplete"
	reasonRegistryFailed     = "RegistryFailed"
	reasonPublished          = "Published"
	reasonLayerTooLarge      = "LayerTooLarge"
	reasonLayerUnpublishable = "LayerUnpublishable"
	// reasonUntrustedChain is the Event reason and, lower-cased, the
	// failure metric's reason of a refused chain.
	reasonUntrustedChain = "UntrustedChain"
	// reasonAnnouncementWithdrawn is the Event of a commit a node
	// announced and will not publish.
	reasonAnnouncementWithdrawn = "AnnouncementWithdrawn"
)

// Actions of the agent's Events (events.k8s.io says what the reporter did
// or failed to do).
const (
	actionProvision = "Provision"
	actionCommit    = "Commit"
	actionDiscard   = "Discard"
	actionEnd       = "End"
	actionRemount   = "Remount"
	actionRemove    = "Remove"
	actionPush      = "Push"
	actionPull      = "Pull"
)

// claimError is a claim that cannot be provisioned as it stands. Reason is
// the Event reason; the message names the input, its value and the fix.
type claimError struct {
	Reason  string
	Message string
}

func (e *claimError) Error() string { return e.Message }

func classError(class, format string, args ...any) error {
	return &claimError{Reason: reasonInvalidStorageClass,
		Message: fmt.Sprintf("StorageClass %q: ", class) + fmt.Sprintf(format, args...)}
}
