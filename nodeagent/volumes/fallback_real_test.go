package volumes

import (
	"context"
	"errors"
	"testing"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/layerfs"
)

// A pull request's builds in namespace pr start from ci's main, granted to
// pr, and keep their own cache; main is never written.
func TestRealSeededFromAnotherNamespace(t *testing.T) {
	env, st := newRealEnv(t, 0, cacheObject("ci", "main", "pr"))
	ciMain := layerfs.CacheRef{Namespace: "ci", Name: "main"}
	main := provisionReal(t, env, "ci", "main", map[string]string{v1alpha1.AnnotationCache: "main"}, nil)
	writeFile(t, main, "main.txt", "main")
	release(t, env, main, v1alpha1.OutcomeSucceeded)

	ann := map[string]string{v1alpha1.AnnotationCache: "pr-1", v1alpha1.AnnotationFallback: "ci/main"}
	first := provisionReal(t, env, "pr", "first", ann, nil)
	if got := first.Annotations[v1alpha1.AnnotationSeededFrom]; got != "ci/main@1" {
		t.Errorf("PV annotation %s = %q, want ci/main@1", v1alpha1.AnnotationSeededFrom, got)
	}
	wantFile(t, first, "main.txt", "main")
	writeFile(t, first, "pr.txt", "pr")
	release(t, env, first, v1alpha1.OutcomeSucceeded)
	wantGeneration(t, st, layerfs.CacheRef{Namespace: "pr", Name: "pr-1"}, 1)
	wantGeneration(t, st, ciMain, 1)

	second := provisionReal(t, env, "pr", "second", ann, nil)
	if _, ok := second.Annotations[v1alpha1.AnnotationSeededFrom]; ok {
		t.Errorf("the second build of an existing cache was seeded: %v", second.Annotations)
	}
	wantFile(t, second, "main.txt", "main")
	wantFile(t, second, "pr.txt", "pr")
	release(t, env, second, v1alpha1.OutcomeSucceeded)

	// A failed first build creates no cache.
	failed := provisionReal(t, env, "pr", "failed", map[string]string{v1alpha1.AnnotationCache: "pr-2", v1alpha1.AnnotationFallback: "ci/main"}, nil)
	writeFile(t, failed, "broken.txt", "broken")
	release(t, env, failed, v1alpha1.OutcomeFailed)
	if info, err := st.Inspect(context.Background(), layerfs.CacheRef{Namespace: "pr", Name: "pr-2"}); !errors.Is(err, layerfs.ErrNotFound) {
		t.Errorf("a failed seeded build left cache pr/pr-2: %+v, %v", info, err)
	}
	wantGeneration(t, st, ciMain, 1)
}
