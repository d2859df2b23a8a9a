package layerfs

import (
	"context"
	"io"
	"path/filepath"
	"time"

	"github.com/layercache/layercache/layerfs/images"
)

// A pulled layer is an image (package layerfs/images) kept under
// images/<id> and mounted at layers/<id>, where every other part of the
// store finds a layer.
func (s *Store) images() images.Dirs {
	return images.Dirs{Images: filepath.Join(s.root, "images"), Layers: s.layersDir()}
}

// remountImages mounts the image of every layer a head references whose
// mount is gone (a reboot), so that the node's layers are all in place
// before the agent serves.
func (s *Store) remountImages(ctx context.Context) error {
	l, err := s.lockStore(ctx, true)
	if err != nil {
		return err
	}
	defer l.Unlock()
	refs, err := s.referencedLayers()
	if err != nil {
		return err
	}
	return s.images().Remount(refs)
}

// pullImage fetches a chain layer's image and mounts it as a new layer,
// which nothing references yet: the sweep removes it if it never lands
// in a head.
func (s *Store) pullImage(ctx context.Context, cl ChainLayer, fetch Fetch, maxBytes int64) (LayerInfo, error) {
	id := randomID()
	open := func(ctx context.Context) (io.ReadCloser, error) { return fetch(ctx, cl) }
	pulled, err := s.images().Pull(ctx, id, s.tmpDir(), cl.Digest, open, maxBytes)
	if err != nil {
		return LayerInfo{}, err
	}
	return LayerInfo{ID: id, Bytes: pulled.Bytes, Files: pulled.Files, Created: time.Now().UTC(), Digest: cl.Digest}, nil
}
