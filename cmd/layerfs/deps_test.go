package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNoControllerRuntime keeps the CLI, an operator's tool on a node, free
// of the control plane's machinery: controller-runtime links the API
// clients, caches and their dependencies into every binary that imports it,
// even through one package borrowed for a helper. It names the packages
// that import controller-runtime, so that the fix is clear.
func TestNoControllerRuntime(t *testing.T) {
	// go test puts its own go first on PATH.
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for line := range strings.Lines(string(out)) {
		pkg, imports, _ := strings.Cut(strings.TrimSpace(line), " ")
		if isControllerRuntime(pkg) {
			continue
		}
		if slices.ContainsFunc(strings.Fields(imports), isControllerRuntime) {
			t.Errorf("%s imports controller-runtime, which the layerfs CLI must not link: move what the CLI needs out of it", pkg)
		}
	}
}

func isControllerRuntime(pkg string) bool {
	return pkg == "sigs.k8s.io/controller-runtime" || strings.HasPrefix(pkg, "sigs.k8s.io/controller-runtime/")
}
