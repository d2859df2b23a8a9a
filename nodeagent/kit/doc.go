// Package kit is what the node agent's parts share and stand on, below
// them all: the store they use (Store, the part of *layerfs.Store the agent
// calls), a volume's request (VolumeRequest) and the parsers that make one
// from a StorageClass (ParseClass), a claim (ParseClaim) or CSI volume
// attributes (CSISettings), each with messages in its own words (terms);
// the Cache client (Caches: access checks, status, the registry
// finalizer); the work queues (CacheQueue, KeyQueue); the Events' reasons
// and actions; and the agent's metrics. It knows no part of the agent: the
// parts import it, never the other way round.
package kit
