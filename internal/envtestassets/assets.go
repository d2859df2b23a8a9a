// Package envtestassets finds the kube-apiserver and etcd that tests run
// against a real API server (the manager's envtest suite, e2e/scale) start.
package envtestassets

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Dir returns $KUBEBUILDER_ASSETS, the directory of kube-apiserver and
// etcd, or an error that says how to make it: target is the make target
// that builds them and runs the test.
func Dir(target string) (string, error) {
	fix := "run `make " + target + "`, which builds kube-apiserver (e2e/cluster/build-kubernetes.sh), installs Debian's etcd-server and sets KUBEBUILDER_ASSETS; " +
		"or set KUBEBUILDER_ASSETS to the directory that e2e/cluster/envtest-assets.sh prints"
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		return "", fmt.Errorf("KUBEBUILDER_ASSETS is not set, so there is no kube-apiserver and etcd to run: %s", fix)
	}
	var errs []error
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		path := filepath.Join(dir, bin)
		fi, err := os.Stat(path)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", bin, err))
		case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
			errs = append(errs, fmt.Errorf("%s: %s is not an executable file", bin, path))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return "", fmt.Errorf("KUBEBUILDER_ASSETS=%s lacks a binary (%w): %s", dir, err, fix)
	}
	return dir, nil
}
