package kit

import "fmt"

// Component is the node agent's name as the API server knows it: its
// Events' source and its writes' field manager.
const Component = "layercache-node"

// Event reasons; they double as the reason label of the failures metric
// (lower-cased), so keep the set small and fixed.
const (
	ReasonInvalidAnnotation   = "InvalidAnnotation"
	ReasonInvalidAttribute    = "InvalidVolumeAttributes"
	ReasonRegistryCache       = "RegistryCacheNotInline"
	ReasonCSINotEnabled       = "CSINotEnabled"
	ReasonInvalidStorageClass = "InvalidStorageClass"
	ReasonCacheTemplate       = "CacheTemplateFailed"
	ReasonCacheAccessDenied   = "CacheAccessDenied"
	ReasonCacheDeleting       = "CacheDeleting"
	ReasonModeForcedRead      = "ModeForcedRead"
	ReasonMountFailed         = "MountFailed"
	ReasonCommitted           = "Committed"
	ReasonCommitDropped       = "CommitDropped"
	ReasonCommitTorn          = "CommitTorn"
	ReasonCommitOverLimit     = "CommitOverLimit"
	ReasonDiscarded           = "Discarded"
	ReasonCommitFailed        = "CommitFailed"
	ReasonDiscardFailed       = "DiscardFailed"
	ReasonInvalidVolume       = "InvalidVolumeAnnotations"
	ReasonRemountFailed       = "RemountFailed"
	ReasonRetention           = "RetentionExceeded"
	ReasonSeeded              = "SeededFromFallback"
)

// Event reasons of registry sync.
const (
	ReasonSyncIncomplete     = "SyncIncomplete"
	ReasonRegistryFailed     = "RegistryFailed"
	ReasonPublished          = "Published"
	ReasonLayerTooLarge      = "LayerTooLarge"
	ReasonLayerUnpublishable = "LayerUnpublishable"
	// ReasonLazyFetchFailed is the Event on a Cache one of whose layers,
	// mounted before its bytes were here, failed a read.
	ReasonLazyFetchFailed = "LazyFetchFailed"
	// ReasonUntrustedChain is the Event reason and, lower-cased, the
	// failure metric's reason of a refused chain.
	ReasonUntrustedChain = "UntrustedChain"
	// ReasonAnnouncementWithdrawn is the Event of a commit a node
	// announced and will not publish.
	ReasonAnnouncementWithdrawn = "AnnouncementWithdrawn"
	// ReasonManifestDeleted, ReasonDeleteRefused and ReasonDeleteFailed
	// tell what became of a deleted Cache's registry copy.
	ReasonManifestDeleted = "RegistryManifestDeleted"
	ReasonDeleteRefused   = "RegistryDeleteRefused"
	ReasonDeleteFailed    = "RegistryDeleteFailed"
)

// Actions of the agent's Events (events.k8s.io says what the reporter did
// or failed to do).
const (
	ActionProvision = "Provision"
	ActionCommit    = "Commit"
	ActionDiscard   = "Discard"
	ActionEnd       = "End"
	ActionRemount   = "Remount"
	ActionRemove    = "Remove"
	ActionPush      = "Push"
	ActionPull      = "Pull"
	ActionDelete    = "Delete"
)

// ClaimError is a claim that cannot be provisioned as it stands. Reason is
// the Event reason; the message names the input, its value and the fix.
type ClaimError struct {
	Reason  string
	Message string
}

func (e *ClaimError) Error() string { return e.Message }

func classError(class, format string, args ...any) error {
	return &ClaimError{Reason: ReasonInvalidStorageClass,
		Message: fmt.Sprintf("StorageClass %q: ", class) + fmt.Sprintf(format, args...)}
}
