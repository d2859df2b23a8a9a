// Package nodeagent is `layercache node`, the agent of one node (a
// DaemonSet, no leader election), and only its wiring: Run opens the
// store and the controller manager; newAgent makes the work queues
// (workqueues.go), the registry sync (package registrysync) and the
// volumes core over it (package volumes); wire connects them to the
// informers it shares among them (the claim informer, claiminformer.go,
// never holds another node's claims) and to the sig-storage provision
// controller; run starts them in order. What every part stands on is the
// package kit.
package nodeagent
