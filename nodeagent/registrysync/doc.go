// Package registrysync keeps a node's caches in step with their registry
// for classes that name one: the Cache's status.published is the
// cluster-wide chain, the registry holds its layers as EROFS images.
//
// The agent makes one Syncer (New) and calls it at five points: before a
// mount it pulls the layers of the chain its node lacks (Pull, pull.go)
// and seeds a new cache from a fallback's (Seed, seed.go); around a
// commit it announces the generation to come (Announce, Committed,
// announce.go), so that readers on other nodes wait for it; after a
// commit it pushes the new layers and appends them to the chain
// (QueuePublish, Publish: publish.go, chain.go); and when a Cache is
// deleted it deletes the registry copy (Unpublish, unpublish.go). Every
// chain read is checked against the StorageClasses the agent serves
// before a byte moves (trust.go). It stands on the package kit and knows
// no other part of the agent.
package registrysync
