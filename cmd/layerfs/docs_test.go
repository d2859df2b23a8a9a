package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/layercache/layercache/internal/mdcheck"
)

// TestDocsLayerfsCommands: every layerfs command in the docs' shell blocks
// names a command of this CLI, with flags it has and values they take.
// Nothing is run, so positional arguments, which each command checks in
// its RunE, are not checked. (e2e/recipes checks the rest of the blocks.)
func TestDocsLayerfsCommands(t *testing.T) {
	const repoRoot = "../.."
	files, err := mdcheck.Files(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range mdcheck.Parse(f, data).Blocks {
			if b.Lang != "sh" {
				continue
			}
			cmds, err := mdcheck.Commands(b.Text)
			if err != nil {
				t.Errorf("%s: %v", b, err)
				continue
			}
			for _, c := range cmds {
				if c.Args[0] != "layerfs" {
					continue
				}
				checked++
				root := newRootCommand(func(string) string { return "" })
				cmd, rest, err := root.Find(c.Args[1:])
				if err != nil || cmd == root {
					t.Errorf("%s, line %d: %q: no such layerfs command (%v)", b, c.Line, c.Args, err)
					continue
				}
				if err := cmd.ParseFlags(rest); err != nil {
					t.Errorf("%s, line %d: %q: %v", b, c.Line, c.Args, err)
					continue
				}
				if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
					t.Errorf("%s, line %d: %q: %v", b, c.Line, c.Args, err)
				}
				if err := cmd.ValidateRequiredFlags(); err != nil {
					t.Errorf("%s, line %d: %q: %v", b, c.Line, c.Args, err)
				}
			}
		}
	}
	if checked < 8 {
		t.Errorf("checked %d layerfs commands; docs/operating.md alone has 11", checked)
	}
}
