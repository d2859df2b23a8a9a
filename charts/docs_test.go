package charts

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/layercache/layercache/internal/mdcheck"
)

// helmPage is the page that shows how to install with the chart.
const helmPage = "docs/helm.md"

// TestHelmPage checks what docs/helm.md asks a reader to run, beyond what
// e2e/recipes' tests check of every page (links, bash -n, kubectl verbs,
// files): each helm command names this chart and flags that render it
// (helm template with the same chart, namespace, values and sets), and
// each YAML block is a values file the chart renders.
func TestHelmPage(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", helmPage))
	if err != nil {
		t.Fatal(err)
	}
	doc := mdcheck.Parse(helmPage, data)
	for _, p := range doc.Problems {
		t.Errorf("%s", p)
	}
	helmCommands, valuesBlocks := 0, 0
	for _, b := range doc.Blocks {
		switch b.Lang {
		case "yaml":
			valuesBlocks++
			file := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(file, []byte(b.Text), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := helm(t, "template", release, chartDir, "--namespace", namespace, "--values", file); err != nil {
				t.Errorf("%s: the chart does not render with these values: %v", b, err)
			}
		case "sh":
			cmds, err := mdcheck.Commands(b.Text)
			if err != nil {
				t.Errorf("%s: %v", b, err)
				continue
			}
			for _, c := range cmds {
				if len(c.Args) == 0 || c.Args[0] != "helm" {
					continue
				}
				helmCommands++
				checkHelmCommand(t, b, c.Args[1:])
			}
		}
	}
	if helmCommands < 3 || valuesBlocks < 1 {
		t.Errorf("read %d helm commands and %d YAML blocks from %s; is the reader broken?", helmCommands, valuesBlocks, helmPage)
	}
}

// checkHelmCommand renders the chart as an install or upgrade command of
// the page would: its chart path, namespace, values files and sets. Flags
// that only steer the install (--wait, --take-ownership, ...) are dropped;
// an unknown flag fails, so that the page gains none unchecked.
func checkHelmCommand(t *testing.T, b mdcheck.Block, args []string) {
	t.Helper()
	if len(args) == 0 {
		t.Errorf("%s: helm without a command", b)
		return
	}
	verb, rest := args[0], args[1:]
	var positional, render []string
	for i := 0; i < len(rest); i++ {
		switch a := rest[i]; a {
		case "--namespace", "-n", "--values", "-f", "--set":
			if i+1 == len(rest) {
				t.Errorf("%s: helm %s %s without a value", b, verb, a)
				return
			}
			v := rest[i+1]
			if a == "--values" || a == "-f" {
				v = filepath.Join("..", v)
			}
			render = append(render, a, v)
			i++
		case "--install", "--reuse-values", "--take-ownership", "--wait", "--create-namespace":
		default:
			if strings.HasPrefix(a, "-") {
				t.Errorf("%s: helm %s %s: a flag this test does not know; teach checkHelmCommand what it means", b, verb, a)
				return
			}
			positional = append(positional, a)
		}
	}
	if !slices.Contains(render, namespace) {
		t.Errorf("%s: helm %s without --namespace %s: the release would land in the kubeconfig's namespace", b, verb, namespace)
	}
	switch verb {
	case "install", "upgrade":
		if len(positional) != 2 || positional[0] != release || positional[1] != "charts/layercache" {
			t.Errorf("%s: helm %s %q: want release %s and chart charts/layercache", b, verb, positional, release)
			return
		}
		if _, err := helm(t, slices.Concat([]string{"template", release, chartDir}, render)...); err != nil {
			t.Errorf("%s: helm %s: %v", b, verb, err)
		}
	case "uninstall":
		if !slices.Equal(positional, []string{release}) {
			t.Errorf("%s: helm uninstall %q: want release %s", b, positional, release)
		}
	default:
		t.Errorf("%s: helm %s: a command this test does not check", b, verb)
	}
}
