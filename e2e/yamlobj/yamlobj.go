// Package yamlobj reads and edits Kubernetes objects decoded from YAML as
// nested maps: what the e2e harness's manifest generators (e2e/tekton,
// e2e/argo) do to an upstream release's manifests before applying them.
package yamlobj

import (
	"errors"
	"fmt"
	"io"
	"os"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// ReadFile decodes every non-empty YAML document of file.
func ReadFile(file string) ([]map[string]any, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var objs []map[string]any
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(obj) > 0 {
			objs = append(objs, obj)
		}
	}
}

// Name is the object's metadata.name, or "".
func Name(obj map[string]any) string {
	n, _ := MapAt(obj, "metadata")["name"].(string)
	return n
}

// MapAt follows keys through nested maps; nil if one is missing.
func MapAt(obj map[string]any, keys ...string) map[string]any {
	m := obj
	for _, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil
		}
		m = next
	}
	return m
}

// List returns the maps of a YAML sequence.
func List(v any) []map[string]any {
	items, _ := v.([]any)
	out := make([]map[string]any, 0, len(items))
	for _, it := range items {
		if m, ok := it.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// MergeEnv sets vars in a container's env, replacing variables of the same
// name.
func MergeEnv(env, vars []map[string]any) []any {
	out := make([]any, 0, len(env)+len(vars))
	set := map[any]bool{}
	for _, v := range vars {
		set[v["name"]] = true
	}
	for _, v := range env {
		if !set[v["name"]] {
			out = append(out, v)
		}
	}
	for _, v := range vars {
		out = append(out, v)
	}
	return out
}
