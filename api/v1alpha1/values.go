package v1alpha1

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Mode is how a volume uses its cache: the value of AnnotationMode.
type Mode string

const (
	// ModeWrite volumes may commit their changes to the cache.
	ModeWrite Mode = "write"
	// ModeRead volumes are read-only views of the cache, never committed.
	ModeRead Mode = "read"
)

// ParseMode returns the Mode that value names. Its error names the
// annotation, the value and the valid values, for an Event.
func ParseMode(value string) (Mode, error) {
	return parseValue(AnnotationMode, value, ModeWrite, ModeRead)
}

// CommitPolicy decides whether a writable volume's changes are committed
// when its build ends: the value of AnnotationCommit.
type CommitPolicy string

const (
	// CommitOnSuccess commits only if the volume's pods succeeded.
	CommitOnSuccess CommitPolicy = "on-success"
	// CommitAlways commits whatever the outcome, even an unknown one.
	CommitAlways CommitPolicy = "always"
	// CommitNever discards the changes.
	CommitNever CommitPolicy = "never"
	// CommitOnMarker commits only if the build wrote MarkerCommit: for CI
	// systems whose pods do not end with the job's result.
	CommitOnMarker CommitPolicy = "on-marker"
)

// ParseCommitPolicy returns the CommitPolicy that value names. Its error
// names the annotation, the value and the valid values, for an Event.
func ParseCommitPolicy(value string) (CommitPolicy, error) {
	return parseValue(AnnotationCommit, value, CommitOnSuccess, CommitAlways, CommitNever, CommitOnMarker)
}

// parseValue returns the one of valid that value names. The empty value is
// invalid too: a default is the caller's to choose.
func parseValue[T ~string](annotation, value string, valid ...T) (T, error) {
	if slices.Contains(valid, T(value)) {
		return T(value), nil
	}
	return "", &InvalidValueError{Annotation: annotation, Value: value, Valid: oneOf(valid)}
}

// InvalidValueError is an annotation value that is none of the valid ones.
// Valid lists them for a message: `"a", "b" or "c"`.
// +kubebuilder:object:generate=false
type InvalidValueError struct {
	Annotation, Value, Valid string
}

func (e *InvalidValueError) Error() string {
	return fmt.Sprintf("annotation %s has value %q: use %s", e.Annotation, e.Value, e.Valid)
}

// oneOf lists values for a message: `"a", "b" or "c"`.
func oneOf[T ~string](values []T) string {
	quoted := make([]string, len(values))
	for i, v := range values {
		quoted[i] = strconv.Quote(string(v))
	}
	last := len(quoted) - 1
	return strings.Join(quoted[:last], ", ") + " or " + quoted[last]
}

// ParseClusterMaxAge parses a cluster-wide max age, as the StorageClass
// parameter ParamClusterMaxAge gives it: a Go duration >= 0, where 0 keeps
// caches forever. Its error names the value and the fix.
func ParseClusterMaxAge(value string) (time.Duration, error) {
	d, err := time.ParseDuration(value)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s has value %q: use a duration of at least 0 such as \"720h\" (30 days), or \"0s\" to keep caches forever", ParamClusterMaxAge, value)
	}
	return d, nil
}
