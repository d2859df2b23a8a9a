package mdcheck

import (
	"reflect"
	"strings"
	"testing"
)

// The slugs of headings this project has, as GitHub makes them (checked
// against the anchors GitHub's rendering of these files links to).
func TestSlug(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"Quick start", "quick-start"},
		{"CSI inline volumes (`make bench-e2e`)", "csi-inline-volumes-make-bench-e2e"},
		{"Tekton Pipelines (`make up WITH=tekton`)", "tekton-pipelines-make-up-withtekton"},
		{"Caches across nodes (`make bench`, `remote/`)", "caches-across-nodes-make-bench-remote"},
		{"layerfs: a cache is a stack of layers", "layerfs-a-cache-is-a-stack-of-layers"},
		{"The node agent (nodeagent)", "the-node-agent-nodeagent"},
		{"Scale (`make scale`, build tag `scale`)", "scale-make-scale-build-tag-scale"},
		{"Where the time goes (28 Nov 2026)", "where-the-time-goes-28-nov-2026"},
		{"Image builders: BuildKit and Docker caches on layercache", "image-builders-buildkit-and-docker-caches-on-layercache"},
		{"What the node agents get (the contract)", "what-the-node-agents-get-the-contract"},
		{"snake_case stays", "snake_case-stays"},
		{"A [linked](x.md) **bold** word", "a-linked-bold-word"},
		{"Against a copy-based peer", "against-a-copy-based-peer"},
	} {
		if got := Slug(tc.heading); got != tc.want {
			t.Errorf("Slug(%q) = %q, want %q", tc.heading, got, tc.want)
		}
	}
}

func TestParse(t *testing.T) {
	doc := Parse("x.md", []byte(strings.Join([]string{
		"# Title",
		"See [a](a.md#b) and `[not](a link)` and ![img](i.png \"t\").",
		"## Usage",
		"```yaml",
		"key: [x](not-a-link)",
		"```",
		"  ```sh",
		"  make test",
		"    indented",
		"  ```",
		"## Usage",
		"~~~",
		"text",
		"~~~",
		"| a | [b](#usage-1) |",
	}, "\n")))
	if len(doc.Problems) > 0 {
		t.Fatalf("problems: %v", doc.Problems)
	}
	if want := []string{"Title", "Usage", "Usage"}; !reflect.DeepEqual(doc.Headings, want) {
		t.Errorf("headings %q, want %q", doc.Headings, want)
	}
	wantAnchors := map[string]bool{"title": true, "usage": true, "usage-1": true}
	if !reflect.DeepEqual(doc.Anchors, wantAnchors) {
		t.Errorf("anchors %v, want %v", doc.Anchors, wantAnchors)
	}
	var targets []string
	for _, l := range doc.Links {
		targets = append(targets, l.Target)
	}
	if want := []string{"a.md#b", "i.png", "#usage-1"}; !reflect.DeepEqual(targets, want) {
		t.Errorf("links %q, want %q", targets, want)
	}
	want := []Block{
		{File: "x.md", Line: 4, Lang: "yaml", Text: "key: [x](not-a-link)\n"},
		{File: "x.md", Line: 7, Lang: "sh", Text: "make test\n  indented\n"},
		{File: "x.md", Line: 12, Lang: "", Text: "text\n"},
	}
	if !reflect.DeepEqual(doc.Blocks, want) {
		t.Errorf("blocks %+v, want %+v", doc.Blocks, want)
	}
}

func TestParseReportsWhatItDoesNotFollow(t *testing.T) {
	for _, tc := range []struct{ name, text string }{
		{"unclosed fence", "```sh\nmake test\n"},
		{"setext heading", "Title\n=====\n"},
		{"reference-style link", "[a][b]\n\n[b]: docs/x.md\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if doc := Parse("x.md", []byte(tc.text)); len(doc.Problems) != 1 {
				t.Errorf("problems %q, want one", doc.Problems)
			}
		})
	}
	if doc := Parse("x.md", []byte("| a | b |\n| --- | --- |\n- item\n---\n")); len(doc.Problems) != 0 {
		t.Errorf("a table, a list and a rule: problems %q, want none", doc.Problems)
	}
}

func TestCommands(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		want         [][]string
	}{
		{"comment", "make test        # everything\n", [][]string{{"make", "test"}}},
		{"operators", "make up && make e2e; make down | tee x || true\n",
			[][]string{{"make", "up"}, {"make", "e2e"}, {"make", "down"}, {"tee", "x"}, {"true"}}},
		{"continuation", "kubectl create secret \\\n  --docker-server=r:5000\n",
			[][]string{{"kubectl", "create", "secret", "--docker-server=r:5000"}}},
		{"quotes", `kubectl patch cache x -p '{"a":1}' -p "{\"b\":\"$(c)\"}"` + "\n",
			[][]string{{"kubectl", "patch", "cache", "x", "-p", `{"a":1}`, "-p", `{"b":"$(c)"}`}}},
		{"quoted operator", "echo 'a && b' \"#\"\n", [][]string{{"echo", "a && b", "#"}}},
		{"here-document", "kubectl create -f - <<EOF\nkind: Job\nEOF\nmake test\n",
			[][]string{{"kubectl", "create", "-f", "-"}, {"make", "test"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmds, err := Commands(tc.script)
			if err != nil {
				t.Fatal(err)
			}
			var got [][]string
			for _, c := range cmds {
				got = append(got, c.Args)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Commands = %q, want %q", got, tc.want)
			}
		})
	}
	if _, err := Commands("echo 'open\n"); err == nil {
		t.Errorf("an unclosed quote: no error")
	}
}
