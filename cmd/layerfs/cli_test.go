package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/layercache/layercache/layerfs"
)

// runCLI runs the CLI in-process and returns its exit status and output.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestUsageErrors pins that every malformed invocation is refused with exit
// status 2 and a message naming the problem, before the store is touched
// (the root does not exist, so touching it would fail differently).
func TestUsageErrors(t *testing.T) {
	root := filepath.Join(t.TempDir(), "must-not-be-created")
	tests := []struct {
		name string
		args []string
		want string // substring of stderr
	}{
		{"no command", nil, "missing command; choose one of: commit, discard, gc, inspect, ls, mount, recover, rm, squash"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"; choose one of`},
		{"misspelt command", []string{"mout"}, "did you mean mount?"},
		{"unknown flag", []string{"ls", "--bogus"}, "unknown flag: --bogus"},
		{"empty root", []string{"--root", "", "ls"}, "--root is empty"},

		{"ls bad output", []string{"ls", "-o", "yaml"}, `invalid output format -o "yaml"; use one of: json, name, table`},
		{"ls argument", []string{"ls", "ci/maven"}, `unexpected argument "ci/maven"; this command takes none`},
		{"ls quiet with json", []string{"ls", "-q", "-o", "json"}, "--quiet prints names only and cannot be combined with -o json"},

		{"mount without volume", []string{"mount", "--cache", "ci/maven"}, "missing argument VOLUME"},
		{"mount two volumes", []string{"mount", "a", "b", "--cache", "ci/maven"}, `unexpected argument "b"; want only VOLUME`},
		{"mount without cache", []string{"mount", "build-1"}, "--cache is required"},
		{"mount cache without namespace", []string{"mount", "build-1", "--cache", "maven"}, "want NAMESPACE/NAME"},
		{"mount cache upper case", []string{"mount", "build-1", "--cache", "ci/Maven"}, `invalid cache name "Maven": it contains upper-case letters`},
		{"mount volume path", []string{"mount", "../x", "--cache", "ci/maven"}, `invalid volume name "../x"`},
		{"mount volume too long", []string{"mount", strings.Repeat("a", 64), "--cache", "ci/maven"}, "it has 64 characters"},
		{"mount mode not octal", []string{"mount", "build-1", "--cache", "ci/maven", "--mode", "0999"}, `--mode "0999" is not an octal file mode`},
		{"mount mode zero", []string{"mount", "build-1", "--cache", "ci/maven", "--mode", "0"}, "would leave the volume unusable"},
		{"mount negative uid", []string{"mount", "build-1", "--cache", "ci/maven", "--uid", "-1"}, "ids must be from 0 to 4294967294"},
		// Issue 8, item 10: 4294967296 wrapped to uid 0 in chown(2).
		{"mount uid past 32 bits", []string{"mount", "build-1", "--cache", "ci/maven", "--uid", "4294967296"}, "--uid 4294967296 --gid 0: ids must be from 0 to 4294967294"},
		{"mount gid past 32 bits", []string{"mount", "build-1", "--cache", "ci/maven", "--gid", "4294967295"}, "ids must be from 0 to 4294967294"},
		{"mount setuid mode", []string{"mount", "build-1", "--cache", "ci/maven", "--mode", "04755"}, "--mode 04755: volume root mode 04755 is not allowed: use permission bits, optionally with setgid or sticky, like 0777, 0755, 02775 or 01777"},
		{"mount uid not a number", []string{"mount", "build-1", "--cache", "ci/maven", "--uid", "me"}, `invalid argument "me" for "--uid"`},
		{"mount fallback without namespace", []string{"mount", "build-1", "--cache", "ci/pr-1", "--fallback", "main"}, "--fallback: invalid cache reference \"main\": want NAMESPACE/NAME"},
		{"mount six fallbacks", []string{"mount", "build-1", "--cache", "ci/pr-1", "--fallback", "ci/a,ci/b,ci/c,ci/d,ci/e,ci/f"}, "use at most 5"},

		{"commit without volume", []string{"commit"}, "missing argument VOLUME"},
		{"commit two volumes", []string{"commit", "a", "b"}, `unexpected argument "b"`},
		{"commit bad volume", []string{"commit", "a_b"}, `invalid volume name "a_b"`},
		{"discard without volume", []string{"discard"}, "missing argument VOLUME"},
		{"discard unknown shorthand", []string{"discard", "-x"}, "unknown shorthand flag: 'x'"},

		{"inspect nothing", []string{"inspect"}, "missing argument NAMESPACE/NAME; name a cache, or a volume with --volume VOLUME"},
		{"inspect both", []string{"inspect", "ci/maven", "--volume", "build-1"}, "give either a cache"},
		{"inspect name output", []string{"inspect", "-o", "name", "ci/maven"}, `invalid output format -o "name"; use one of: json, table`},
		{"inspect bad cache", []string{"inspect", "ci/maven/x"}, `invalid cache name "maven/x"`},
		{"inspect bad volume", []string{"inspect", "--volume", "Build"}, `invalid volume name "Build"`},

		{"squash without cache", []string{"squash"}, "missing argument NAMESPACE/NAME"},
		{"squash zero layers", []string{"squash", "ci/maven", "--max-layers", "0"}, "--max-layers 0: a cache needs at least one layer"},

		{"gc argument", []string{"gc", "now"}, `unexpected argument "now"`},
		{"gc bad size", []string{"gc", "--max-bytes", "lots"}, `"lots" is not a size; use bytes or a quantity such as 50Gi`},
		{"gc negative size", []string{"gc", "--max-bytes", "-1Gi"}, `"-1Gi" is negative`},
		{"gc bad age", []string{"gc", "--max-age", "a month"}, `invalid argument "a month" for "--max-age"`},
		{"gc negative age", []string{"gc", "--max-age", "-1h"}, "--max-age -1h0m0s is negative"},

		{"rm without cache", []string{"rm"}, "missing argument NAMESPACE/NAME"},
		{"rm bad cache", []string{"rm", "/maven"}, `invalid namespace name ""`},
		{"recover argument", []string{"recover", "now"}, `unexpected argument "now"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append([]string{"--root", root}, tt.args...)...)
			if code != exitUsage {
				t.Errorf("exit status %d, want %d (usage error); stderr:\n%s", code, exitUsage, stderr)
			}
			if !strings.Contains(stderr, tt.want) {
				t.Errorf("stderr does not contain %q:\n%s", tt.want, stderr)
			}
			if !strings.Contains(stderr, "--help' for usage.") {
				t.Errorf("stderr does not point at --help:\n%s", stderr)
			}
			if stdout != "" {
				t.Errorf("stdout must stay empty on a usage error, got:\n%s", stdout)
			}
			if _, err := os.Stat(root); err == nil {
				t.Errorf("the store root was created: a usage error must not touch the store")
			}
		})
	}
}

// TestOperationFailureExitStatus pins that a failing operation exits 1, not
// 2, and says what failed.
func TestOperationFailureExitStatus(t *testing.T) {
	// A root below a regular file can never be created.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := [][]string{
		{"ls"},
		{"ls", "--volumes"},
		{"inspect", "ci/maven"},
		{"commit", "build-1"},
		{"gc"},
		{"recover"},
	}
	for _, args := range tests {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append([]string{"--root", filepath.Join(file, "store")}, args...)...)
			if code != exitFailure {
				t.Errorf("exit status %d, want %d; stderr:\n%s", code, exitFailure, stderr)
			}
			if !strings.HasPrefix(stderr, "layerfs: ") || strings.Contains(stderr, "for usage") {
				t.Errorf("stderr should be one failure message without a usage hint:\n%s", stderr)
			}
			if stdout != "" {
				t.Errorf("stdout must stay empty on failure, got:\n%s", stdout)
			}
		})
	}
}

func TestHelpDocumentsExitStatus(t *testing.T) {
	root := newRootCommand(func(string) string { return "" })
	for _, cmd := range append(root.Commands(), root) {
		if !strings.Contains(cmd.Long, "Exit status: 0 on success, 1 when the operation failed, 2 on a usage error") {
			t.Errorf("help of %q does not document the exit status", cmd.CommandPath())
		}
	}
	code, stdout, _ := runCLI(t, "mount", "--help")
	if code != exitOK || !strings.Contains(stdout, "Exit status") || !strings.Contains(stdout, "--cache string") {
		t.Errorf("mount --help: exit status %d, output:\n%s", code, stdout)
	}
}

func TestRootPrecedence(t *testing.T) {
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		flag string // "" means not given
		env  string
		want string
	}{
		{name: "default", want: "/var/lib/layercache"},
		{name: "env", env: "/srv/cache", want: "/srv/cache"},
		{name: "flag wins over env", flag: "/mnt/store", env: "/srv/cache", want: "/mnt/store"},
		{name: "relative flag made absolute", flag: "store", want: filepath.Join(cwd, "store")},
		{name: "relative env made absolute", env: "./store/", want: filepath.Join(cwd, "store")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &globalOptions{root: tt.flag, getenv: func(key string) string {
				if key != rootEnv {
					t.Errorf("read env %q, want %q", key, rootEnv)
				}
				return tt.env
			}}
			if err := g.resolveRoot(tt.flag != ""); err != nil {
				t.Fatal(err)
			}
			if g.root != tt.want {
				t.Errorf("root %q, want %q", g.root, tt.want)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	tests := []struct {
		in      string
		want    os.FileMode
		wantErr bool
	}{
		{in: "0777", want: 0o777},
		{in: "755", want: 0o755},
		{in: "0o700", want: 0o700},
		{in: "01777", want: os.ModeSticky | 0o777},
		{in: "02775", want: os.ModeSetgid | 0o775},
		{in: "04755", want: os.ModeSetuid | 0o755},
		{in: "0", wantErr: true},
		{in: "", wantErr: true},
		{in: "rwxr-xr-x", wantErr: true},
		{in: "0888", wantErr: true},
		{in: "017777", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseMode(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseMode(%q) error %v, want error %v", tt.in, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("parseMode(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestMaxBytesQuantity(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{in: "50Gi", want: 50 << 30},
		{in: "1000", want: 1000},
		{in: "500M", want: 500_000_000},
		{in: "1.5Ki", want: 1536},
		{in: "0.5", want: 1}, // a bound rounds up, never to zero (no limit)
		{in: "0", want: 0},
		{in: "1e3", want: 1000},
		{in: "-1", wantErr: true},
		{in: "50GB", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var q quantityValue
			err := q.Set(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Set(%q) error %v, want error %v", tt.in, err, tt.wantErr)
			}
			if q.bytes != tt.want {
				t.Errorf("Set(%q) = %d bytes, want %d", tt.in, q.bytes, tt.want)
			}
		})
	}
}

// TestFlagsReachTheStore checks what validated flags turn into, since the
// run functions only see the result.
func TestFlagsReachTheStore(t *testing.T) {
	o := &mountOptions{cache: "ci/maven", readOnly: true, uid: 1000, gid: 2000, mode: "0750", writer: "ci/build-1"}
	id, opts, err := o.validate([]string{"build-1"})
	if err != nil {
		t.Fatal(err)
	}
	if id != "build-1" || opts.Cache.String() != "ci/maven" || !opts.ReadOnly || opts.UID != 1000 || opts.GID != 2000 || opts.Mode != 0o750 || opts.Writer != "ci/build-1" {
		t.Errorf("validate gave %q %+v", id, opts)
	}

	gc := newGCCommand(&globalOptions{})
	if got := gc.Flags().Lookup("max-age").DefValue; got != "720h0m0s" {
		t.Errorf("--max-age default %s, want 720h", got)
	}
	if got := gc.Flags().Lookup("max-bytes").DefValue; got != "50Gi" {
		t.Errorf("--max-bytes default %s, want 50Gi", got)
	}
}

// --layout reaches the store; a bad value is refused before any work.
func TestMountLayoutFlag(t *testing.T) {
	for _, tt := range []struct {
		layout  string
		want    layerfs.Layout
		wantErr bool
	}{{"", "", false}, {"overlay", layerfs.LayoutOverlay, false}, {"snapshot", layerfs.LayoutSnapshot, false}, {"zfs", "", true}} {
		o := &mountOptions{cache: "ci/maven", mode: "0777", layout: tt.layout}
		_, opts, err := o.validate([]string{"build-1"})
		if (err != nil) != tt.wantErr || opts.Layout != tt.want {
			t.Errorf("--layout %q: %q, %v; want %q (error %v)", tt.layout, opts.Layout, err, tt.want, tt.wantErr)
		}
	}
}

func TestMountFallbackFlag(t *testing.T) {
	o := &mountOptions{cache: "ci/pr-1", mode: "0777", fallbacks: []string{"ci/main", "trusted/main"}}
	_, opts, err := o.validate([]string{"build-1"})
	want := []layerfs.CacheRef{{Namespace: "ci", Name: "main"}, {Namespace: "trusted", Name: "main"}}
	if err != nil || !slices.Equal(opts.Fallbacks, want) {
		t.Errorf("--fallback: %v, %v; want %v", opts.Fallbacks, err, want)
	}
}
