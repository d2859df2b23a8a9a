package benchsize

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		v         string
		smoke, ok bool
	}{
		{"", false, true}, {"full", false, true}, {"smoke", true, true},
		{"Smoke", false, false}, {"small", false, false}, {" full", false, false},
	} {
		smoke, err := parse(tc.v)
		if smoke != tc.smoke || (err == nil) != tc.ok {
			t.Errorf("parse(%q) = %v, %v; want %v, ok=%v", tc.v, smoke, err, tc.smoke, tc.ok)
		}
		// The error says the value and the allowed ones.
		if err != nil && !(strings.Contains(err.Error(), Var+`="`+tc.v+`"`) && strings.Contains(err.Error(), "full") && strings.Contains(err.Error(), "smoke")) {
			t.Errorf("parse(%q) error %q does not name the value and the allowed ones", tc.v, err)
		}
	}
}

func TestPick(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want int
	}{{"", 1024}, {"full", 1024}, {"smoke", 64}} {
		t.Setenv(Var, tc.env)
		if got := Pick(t, 1024, 64); got != tc.want {
			t.Errorf("%s=%q: Pick(1024, 64) = %d, want %d", Var, tc.env, got, tc.want)
		}
	}
}

func TestParseEnv(t *testing.T) {
	for _, tc := range []struct {
		v       string
		want    int64
		wantErr string
	}{
		{"", 7, ""}, {"256", 256, ""},
		{"0", 0, `LAYERFS_BENCH_SEED_MIB="0": want a number of MiB`},
		{"-3", 0, "a positive integer"}, {"1G", 0, `"1G"`},
	} {
		got, err := parseEnv("LAYERFS_BENCH_SEED_MIB", tc.v, 7, "a number of MiB")
		if got != tc.want || (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("parseEnv(%q) = %d, %v; want %d, error with %q", tc.v, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestNames(t *testing.T) {
	for n, want := range map[int]string{1000: "1k", 100000: "100k", 5000: "5k", 1500: "1500", 200: "200"} {
		if got := Count(n); got != want {
			t.Errorf("Count(%d) = %q, want %q", n, got, want)
		}
	}
	for n, want := range map[int64]string{4 << 10: "4KiB", 64 << 20: "64MiB", 1 << 30: "1GiB", 1536 << 20: "1536MiB", 100: "100B"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
