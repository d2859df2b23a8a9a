package v1alpha1

import (
	"slices"
	"strings"
)

// Summarized derives the summary fields from the cache's replicas on
// existing nodes: what the manager keeps. The published chain is the node
// agents' and is kept as it is: left out, the manager's status patch would
// delete it. LastUsed keeps the newest time ever seen, so a cache that
// every node evicted still says when it was last used (what cluster-wide
// retention reads).
func (in CacheStatus) Summarized(replicas []CacheReplica) CacheStatus {
	out := CacheStatus{Published: in.Published.DeepCopy(), LastUsed: in.LastUsed.DeepCopy()}
	var total int64
	var seeds []string
	for i := range replicas {
		r := &replicas[i].Status
		out.Generation = max(out.Generation, r.Generation)
		total += r.SizeBytes
		if r.LastUsed != nil && (out.LastUsed == nil || r.LastUsed.After(out.LastUsed.Time)) {
			out.LastUsed = r.LastUsed.DeepCopy()
		}
		if r.SeededFrom != nil {
			seeds = append(seeds, r.SeededFrom.String())
		}
	}
	out.NodeCount = int32(len(replicas))
	if len(replicas) > 0 {
		out.Size = FormatSize(total)
	}
	// Nodes that seeded their copies apart (node-local classes) may have
	// started from different generations of the fallback: name each once.
	slices.Sort(seeds)
	out.SeededFrom = strings.Join(slices.Compact(seeds), ", ")
	return out
}
