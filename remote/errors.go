package remote

import (
	"errors"
	"net/http"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// IsUnauthorized tells whether the registry refused the credentials: no
// retry helps, the Secret must be fixed.
func IsUnauthorized(err error) bool {
	var terr *transport.Error
	if !errors.As(err, &terr) {
		return false
	}
	return terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden
}

// ErrCorrupt is a layer blob's frame whose bytes do not match the
// layer's index: the registry's copy is damaged or not the layer's. A
// retry of the same read gets the same bytes; the layer must be pushed
// again, or fetched from elsewhere.
var ErrCorrupt = errors.New("layer blob does not match its index")
