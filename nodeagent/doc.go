// Package nodeagent is `layercache node`, the agent of one node (a
// DaemonSet, no leader election), and only its wiring: Run opens the
// store and the controller manager; newAgent makes the work queues
// (workqueues.go), the informers of this node's pods and PVs, the
// registry sync (package registrysync) and the volumes core over it
// (package volumes), which watches those informers and the claim
// informer (claiminformer.go, which never holds another node's claims);
// wire makes the sig-storage provision controller over the same
// informers; run starts them in order. What every part stands on is the
// package kit.
package nodeagent
