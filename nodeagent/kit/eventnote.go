package kit

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

// maxEventNote is the API server's bound on an Event's message; it
// rejects a longer one whole.
const maxEventNote = 1024

// noteCut marks where BoundNote left out the middle of a message.
const noteCut = " [...] "

// BoundedRecorder keeps every Event's message within maxEventNote. The
// agent's messages carry error chains that name paths, URLs and digests,
// and one past the bound would be lost, not shortened: the store's
// LazyFetchFailed was, in an e2e run.
type BoundedRecorder struct {
	events.EventRecorder
}

func (r BoundedRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.EventRecorder.Eventf(regarding, related, eventtype, reason, action, "%s", BoundNote(fmt.Sprintf(note, args...)))
}

// BoundNote returns s if it fits an Event, or its start (what happened)
// and its end (what to do, or the root cause) around noteCut.
func BoundNote(s string) string {
	if len(s) <= maxEventNote {
		return s
	}
	keep := maxEventNote - len(noteCut)
	head := keep / 2
	// Slicing bytes may split a character; drop the broken pieces.
	return strings.ToValidUTF8(s[:head], "") + noteCut + strings.ToValidUTF8(s[len(s)-(keep-head):], "")
}
