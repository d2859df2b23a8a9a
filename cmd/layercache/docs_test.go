package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
)

// referenceFlags reads the table of flags that follows the paragraph that
// starts with `heading` in docs/reference.md: flag name -> its default cell.
func referenceFlags(t *testing.T, heading string) map[string]string {
	t.Helper()
	data, err := os.ReadFile("../../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), "\n\n"+heading)
	if !ok {
		t.Fatalf("docs/reference.md has no paragraph starting %q before its table", heading)
	}
	row := regexp.MustCompile("^\\| `(--[a-z0-9-]+)` \\| ([^|]*) \\|")
	flags := map[string]string{}
	inTable := false
	for _, line := range strings.Split(after, "\n") {
		switch {
		case strings.HasPrefix(line, "|"):
			inTable = true
			if m := row.FindStringSubmatch(line); m != nil {
				flags[m[1]] = strings.TrimSpace(m[2])
			}
		case inTable:
			return flags
		}
	}
	return flags
}

// sameDefault says whether the reference's default cell gives the flag's
// default: its first `value`, equal as written, as a duration or as a
// quantity; an empty default is "empty..." or "env ...".
func sameDefault(f *pflag.Flag, cell string) bool {
	if f.DefValue == "" {
		return strings.HasPrefix(cell, "empty") || strings.HasPrefix(cell, "env ")
	}
	m := regexp.MustCompile("`([^`]*)`").FindStringSubmatch(cell)
	if m == nil {
		return false
	}
	doc := strings.Trim(m[1], `"`)
	if doc == strings.Trim(f.DefValue, `"`) {
		return true
	}
	if d1, err := time.ParseDuration(f.DefValue); err == nil {
		if doc == "0" {
			return d1 == 0
		}
		d2, err := time.ParseDuration(doc)
		return err == nil && d1 == d2
	}
	if q1, err := resource.ParseQuantity(f.DefValue); err == nil {
		q2, err := resource.ParseQuantity(doc)
		return err == nil && q1.Cmp(q2) == 0
	}
	return false
}

// TestReferenceListsEveryFlag: docs/reference.md's flag tables list every
// flag of `layercache node`, `lazyfs` and `manager` (but help and the
// zap logging flags, which it names together) with its default, and no
// flag the commands lack.
func TestReferenceListsEveryFlag(t *testing.T) {
	// The defaults that come from the environment, as in a pod without it.
	for _, env := range []string{"LAYERCACHE_ROOT", "NODE_NAME", "POD_NAMESPACE"} {
		t.Setenv(env, "")
	}
	root := newRootCommand()
	for _, tc := range []struct{ command, heading string }{
		{"node", "`layercache node`:"},
		{"lazyfs", "`layercache lazyfs` ("},
		{"manager", "`layercache manager`:"},
	} {
		t.Run(tc.command, func(t *testing.T) {
			cmd, _, err := root.Find([]string{tc.command})
			if err != nil {
				t.Fatal(err)
			}
			documented := referenceFlags(t, tc.heading)
			if len(documented) == 0 {
				t.Fatalf("no flag rows under %q in docs/reference.md", tc.heading)
			}
			cmd.Flags().VisitAll(func(f *pflag.Flag) {
				if f.Name == "help" || strings.HasPrefix(f.Name, "zap-") {
					return
				}
				cell, ok := documented["--"+f.Name]
				delete(documented, "--"+f.Name)
				switch {
				case !ok:
					t.Errorf("--%s (default %q: %s) is not in docs/reference.md's table", f.Name, f.DefValue, f.Usage)
				case !sameDefault(f, cell):
					t.Errorf("--%s: docs/reference.md gives the default as %q, the flag's is %q", f.Name, cell, f.DefValue)
				}
			})
			for name := range documented {
				t.Errorf("docs/reference.md lists %s, which layercache %s does not have", name, tc.command)
			}
		})
	}
}
