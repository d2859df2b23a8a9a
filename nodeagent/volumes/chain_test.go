package volumes

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/layercache/layercache/layerfs"
)

// interruptedStore fails SetLayerDigest once, as an agent killed between
// the chain's update and the digest's record leaves its store.
type interruptedStore struct {
	*layerfs.Store
	failed bool
}

func (s *interruptedStore) SetLayerDigest(ctx context.Context, ref layerfs.CacheRef, id, digest string) error {
	if !s.failed {
		s.failed = true
		return errors.New("killed before recording the digest")
	}
	return s.Store.SetLayerDigest(ctx, ref, id, digest)
}

func TestSyncPublishInterruptedAfterTheChainUpdateIsNotDuplicated(t *testing.T) {
	c := newSyncCluster(t)
	a := c.nodes["node-a"]
	a = c.startAgentWith(t, "node-a", a.store, func(p *nodeParts) { p.setStore(&interruptedStore{Store: a.store}) })
	pv := c.provision(t, "node-a", "build")
	writeFile(t, pv, "x.txt", "once")
	if err := c.commit(t, "node-a", pv); err == nil {
		t.Fatal("publish succeeded although the digest could not be recorded")
	}
	if pub := c.published(t); pub.Generation != 1 {
		t.Fatalf("chain %+v: want the layer appended before the interruption", pub)
	}
	// The restarted agent finds the layer unpublished, pushes the same
	// blob again and finds it in the chain.
	if err := a.sync.Publish(context.Background(), maven); err != nil {
		t.Fatal(err)
	}
	if pub := c.published(t); pub.Generation != 1 || len(pub.Layers) != 1 {
		t.Errorf("chain %+v: want the layer once", pub)
	}
	info, err := a.store.Inspect(context.Background(), maven)
	if err != nil || a.sync.Status(maven, info).Unpublished != 0 || info.Layers[0].Digest != c.published(t).Layers[0].Digest {
		t.Errorf("node-a's layers %+v (%v): want the layer recorded as published", info.Layers, err)
	}
}

func TestSyncSquashReplacesTheRunItCovers(t *testing.T) {
	c := newSyncCluster(t)
	ctx := context.Background()
	for i := range 3 {
		pv := c.provision(t, "node-a", fmt.Sprint("build-", i))
		writeFile(t, pv, fmt.Sprint("gen-", i), fmt.Sprint(i))
		if err := c.commit(t, "node-a", pv); err != nil {
			t.Fatal(err)
		}
	}
	c.provision(t, "node-b", "holds-three") // node-b now has the three layers
	a := c.nodes["node-a"]
	if res, err := a.store.Squash(ctx, maven, 1); err != nil || !res.Squashed {
		t.Fatalf("squash: %+v, %v", res, err)
	}
	if err := a.sync.Publish(ctx, maven); err != nil {
		t.Fatal(err)
	}
	pub := c.published(t)
	if len(pub.Layers) != 1 || len(pub.Layers[0].Covers) != 3 || pub.Generation != 3 || pub.Layers[0].Generation != 3 {
		t.Fatalf("chain %+v: want one squash layer covering the three, at generation 3", pub)
	}
	before := quietRequests(t, c.reg)
	onB := c.provision(t, "node-b", "after-squash")
	if n := c.reg.Requests.Load() - before; n != 0 {
		t.Errorf("node-b, which holds the covered layers, made %d registry requests, want 0", n)
	}
	fresh := c.addNode(t, "node-c")
	onC := c.provision(t, "node-c", "fresh")
	for i := range 3 {
		wantFile(t, onB, fmt.Sprint("gen-", i), fmt.Sprint(i))
		wantFile(t, onC, fmt.Sprint("gen-", i), fmt.Sprint(i))
	}
	info, err := fresh.store.Inspect(ctx, maven)
	if err != nil || len(info.Layers) != 1 {
		t.Errorf("a fresh node's cache %+v (%v): want the one squash layer", info.Layers, err)
	}
}
