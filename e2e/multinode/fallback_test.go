//go:build e2e && multinode

package multinode

import (
	"bufio"
	"context"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/layercache/layercache/api/v1alpha1"
)

// TestFallbackSeedsAcrossNodes: main is built and published on node A.
// pr-1's first build, on node B with fallback main, starts from main's
// files (node B pulls main as a read of it would); its commit publishes
// pr-1 as its own layer on top of exactly main's blobs, mounted into
// pr-1's repository by the registry, not uploaded again. pr-1's next
// build, on node A, sees main's files and pr-1's.
func TestFallbackSeedsAcrossNodes(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	defer cancel()
	a, b := e.node(0), e.node(1)

	e.run(ctx, e.buildPod("main-1", a, "main", "", "echo one > /cache/main1.txt"))
	e.run(ctx, e.buildPod("main-2", a, "main", "", "echo two > /cache/main2.txt"))
	mainPub := e.waitPublished(ctx, "main", 2).Status.Published
	mainDigests := layerDigests(mainPub)

	out := e.run(ctx, withFallback(e.buildPod("pr-first", b, "pr-1", "", "cat /cache/main1.txt /cache/main2.txt; echo pr > /cache/pr.txt"), "main"))
	if got := strings.Fields(out); !slices.Equal(got, []string{"one", "two"}) {
		t.Fatalf("pr-1's first build on %s read %q, want main's files (one, two)", b, out)
	}
	e.waitEvent(ctx, "PersistentVolumeClaim", "pr-first-cache", "SeededFromFallback", "starts from fallback "+e.Namespace+"/main at generation 2")

	prPub := e.waitPublished(ctx, "pr-1", 3).Status.Published
	prDigests := layerDigests(prPub)
	if want := e.Reg.Repository + "/" + e.Namespace + "/pr-1"; prPub.Repository != want || len(prDigests) != 3 ||
		!slices.Equal(prDigests[1:], mainDigests) || slices.Contains(mainDigests, prDigests[0]) || prPub.Layers[0].Node != b {
		t.Fatalf("pr-1's chain %v in %s: want %s's own layer on exactly main's %v, in %s", prDigests, prPub.Repository, b, mainDigests, want)
	}

	// The registry mounted main's blobs into pr-1's repository.
	prRepo := strings.TrimPrefix(prPub.Repository, e.Reg.Address+"/")
	mainRepo := strings.TrimPrefix(mainPub.Repository, e.Reg.Address+"/")
	reqs := e.registryRequests(t, "/v2/"+prRepo+"/blobs/")
	for _, d := range mainDigests {
		mounted := slices.ContainsFunc(reqs, func(r registryRequest) bool {
			return r.Method == "POST" && r.Status == 201 && r.URL.Query().Get("mount") == d && r.URL.Query().Get("from") == mainRepo
		})
		if !mounted {
			t.Errorf("no mount of main's blob %s from %s answered 201 in the registry's log; pr-1's blob requests: %v", d, mainRepo, reqs)
		}
		if slices.ContainsFunc(reqs, func(r registryRequest) bool { return r.Method == "PUT" && r.URL.Query().Get("digest") == d }) {
			t.Errorf("main's blob %s was uploaded into pr-1's repository again; pr-1's blob requests: %v", d, reqs)
		}
	}

	out = e.run(ctx, withFallback(e.buildPod("pr-next", a, "pr-1", "", "cat /cache/main1.txt /cache/main2.txt /cache/pr.txt"), "main"))
	if got := strings.Fields(out); !slices.Equal(got, []string{"one", "two", "pr"}) {
		t.Fatalf("pr-1's next build on %s read %q, want main's files and pr-1's (one, two, pr)", a, out)
	}
}

// withFallback annotates the pod's cache claim with fallbacks.
func withFallback(pod *corev1.Pod, fallbacks string) *corev1.Pod {
	tmpl := pod.Spec.Volumes[0].Ephemeral.VolumeClaimTemplate
	tmpl.Annotations[v1alpha1.AnnotationFallback] = fallbacks
	return pod
}

func layerDigests(pub *v1alpha1.PublishedChain) []string {
	var out []string
	for _, l := range pub.Layers {
		out = append(out, l.Digest)
	}
	return out
}

// registryRequest is one line of the registry's access log.
type registryRequest struct {
	Method string
	URL    *url.URL
	Status int
}

func (r registryRequest) String() string {
	return r.Method + " " + r.URL.String() + " " + strconv.Itoa(r.Status)
}

// registryRequests are the requests of the registry's access log (the
// combined log format: ... "METHOD URI PROTO" STATUS ...) whose path
// starts with prefix.
func (e *syncEnv) registryRequests(t *testing.T, prefix string) []registryRequest {
	t.Helper()
	f, err := os.Open(e.Reg.Log)
	if err != nil {
		t.Fatalf("the registry's log: %v", err)
	}
	defer f.Close()
	var out []registryRequest
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		_, rest, ok := strings.Cut(sc.Text(), `] "`)
		if !ok {
			continue
		}
		request, after, ok := strings.Cut(rest, `" `)
		parts := strings.Fields(request)
		fields := strings.Fields(after)
		if !ok || len(parts) != 3 || len(fields) == 0 {
			continue
		}
		u, err := url.ParseRequestURI(parts[1])
		status, serr := strconv.Atoi(fields[0])
		if err != nil || serr != nil || !strings.HasPrefix(u.Path, prefix) {
			continue
		}
		out = append(out, registryRequest{Method: parts[0], URL: u, Status: status})
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read the registry's log %s: %v", e.Reg.Log, err)
	}
	return out
}
