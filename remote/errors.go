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
