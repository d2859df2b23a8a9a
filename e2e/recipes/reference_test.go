package recipes

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/layercache/layercache/nodeagent/kit"
)

// docs/reference.md lists the StorageClass parameters, CSI volume
// attributes, metrics and Event reasons the code has, and nothing the code
// lacks, so that none can ship undocumented. The parameters and attributes
// are read from the node agent's own refusal of an unknown one, the
// metrics and Events from the source (the node agent's and the manager's
// packages, tests left out). The flags are checked against
// the commands themselves (cmd/layercache's TestReferenceListsEveryFlag).

// referenceSection returns the text of docs/reference.md's `## title`
// section.
func referenceSection(t *testing.T, title string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "docs/reference.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), "\n## "+title+"\n")
	if !ok {
		t.Fatalf("docs/reference.md has no section %q", title)
	}
	if i := strings.Index(after, "\n## "); i >= 0 {
		after = after[:i]
	}
	return after
}

// firstColumn returns the names in backquotes in the first column of the
// section's table rows (a cell may name several: "`A`, `B`").
func firstColumn(section string) map[string]bool {
	names := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| `") || len(cells) < 3 {
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[1], -1) {
			names[m[1]] = true
		}
	}
	return names
}

// goFiles parses the non-test Go files under the given directories.
func goFiles(t *testing.T, dirs ...string) []*ast.File {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			files = append(files, f)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return files
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// compareSets reports what the code has and the reference lacks, and the
// other way round.
func compareSets(t *testing.T, what string, code, documented map[string]bool) {
	t.Helper()
	if len(code) == 0 {
		t.Fatalf("found no %s in the code: is the reader broken?", what)
	}
	var missing, extra []string
	for n := range code {
		if !documented[n] {
			missing = append(missing, n)
		}
	}
	for n := range documented {
		if !code[n] {
			extra = append(extra, n)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 {
		t.Errorf("%s the code has and docs/reference.md does not list: %v", what, missing)
	}
	if len(extra) > 0 {
		t.Errorf("%s docs/reference.md lists and the code does not have: %v", what, extra)
	}
}

func TestReferenceListsEveryMetric(t *testing.T) {
	name := regexp.MustCompile(`^layercache_[a-z0-9_]+$`)
	code := map[string]bool{}
	for _, f := range goFiles(t, "nodeagent", "cachemanager") {
		ast.Inspect(f, func(n ast.Node) bool {
			if e, ok := n.(ast.Expr); ok {
				if s, ok := stringLit(e); ok && name.MatchString(s) {
					code[s] = true
				}
			}
			return true
		})
	}
	compareSets(t, "metrics", code, firstColumn(referenceSection(t, "Metrics")))
}

func TestReferenceListsEveryEvent(t *testing.T) {
	code := map[string]bool{}
	// The node agent's reasons are kit's Reason constants.
	for _, f := range goFiles(t, "nodeagent/kit") {
		ast.Inspect(f, func(n ast.Node) bool {
			if spec, ok := n.(*ast.ValueSpec); ok {
				for i, id := range spec.Names {
					if strings.HasPrefix(id.Name, "Reason") && i < len(spec.Values) {
						if s, ok := stringLit(spec.Values[i]); ok {
							code[s] = true
						}
					}
				}
			}
			return true
		})
	}
	// The manager's are the reason arguments of its Eventf calls.
	for _, f := range goFiles(t, "cachemanager") {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Eventf" && len(call.Args) > 3 {
				if s, ok := stringLit(call.Args[3]); ok {
					code[s] = true
				} else {
					t.Errorf("a manager Eventf call whose reason is not a string literal (%T): this test cannot read it", call.Args[3])
				}
			}
			return true
		})
	}
	compareSets(t, "Event reasons", code, firstColumn(referenceSection(t, "Events")))
}

// TestReferenceListsEveryClassParameter: the StorageClass parameters table
// lists exactly the parameters the node agent takes, as its refusal of an
// unknown one names them.
func TestReferenceListsEveryClassParameter(t *testing.T) {
	sc := shippedClass(t)
	sc.Parameters = map[string]string{"not-a-parameter": "x"}
	_, err := kit.ParseClass(sc)
	if err == nil {
		t.Fatal("the node agent takes a class with parameter not-a-parameter")
	}
	_, list, ok := strings.Cut(err.Error(), "the valid parameters are ")
	if !ok {
		t.Fatalf("the refusal %q does not list the valid parameters; this test reads them from it", err)
	}
	code := map[string]bool{}
	for _, p := range regexp.MustCompile(`, | and `).Split(list, -1) {
		code[strings.TrimSpace(p)] = true
	}
	compareSets(t, "StorageClass parameters", code, firstColumn(referenceSection(t, "StorageClass parameters")))
}

// TestReferenceListsEveryCSIAttribute: the CSI volume attributes table
// lists exactly the attributes the node agent takes, as its refusal of an
// unknown one names them.
func TestReferenceListsEveryCSIAttribute(t *testing.T) {
	attrs := map[string]string{kit.AttrEphemeral: "true", kit.AttrPodNamespace: "ci", kit.AttrPodName: "build", kit.AttrPodUID: "uid-1", "cache": "maven", "not-an-attribute": "x"}
	pod, err := kit.ParseCSIPod(attrs)
	if err != nil {
		t.Fatal(err)
	}
	_, err = kit.CSISettings(attrs, pod, false, kit.CSILimits{Default: 1 << 30, Max: 1 << 30})
	if err == nil {
		t.Fatal("the node agent takes a CSI volume with attribute not-an-attribute")
	}
	_, list, ok := strings.Cut(err.Error(), "the valid ones are ")
	if !ok {
		t.Fatalf("the refusal %q does not list the valid attributes; this test reads them from it", err)
	}
	code := map[string]bool{}
	for _, p := range regexp.MustCompile(`, | and `).Split(list, -1) {
		code[strings.TrimSuffix(strings.TrimSpace(p), " (required)")] = true
	}
	compareSets(t, "CSI volume attributes", code, firstColumn(referenceSection(t, "CSI volume attributes")))
}

// TestReferenceNamesEveryLabelAndAnnotation: every layercache.dev/ name of
// the API's public names (api/v1alpha1: annotations, labels, finalizers)
// is in docs/reference.md.
func TestReferenceNamesEveryLabelAndAnnotation(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "docs/reference.md"))
	if err != nil {
		t.Fatal(err)
	}
	names := 0
	for _, f := range goFiles(t, "api/v1alpha1") {
		ast.Inspect(f, func(n ast.Node) bool {
			spec, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, id := range spec.Names {
				if i >= len(spec.Values) || id.Name == "ProvisionerName" {
					continue // the provisioner's name, which a class names
				}
				if s, ok := stringLit(spec.Values[i]); ok && strings.HasPrefix(s, "layercache.dev/") {
					names++
					if !strings.Contains(string(data), "`"+s+"`") {
						t.Errorf("%s (%s) is not in docs/reference.md", s, id.Name)
					}
				}
			}
			return true
		})
	}
	if names < 15 {
		t.Errorf("found %d layercache.dev/ names in api/v1alpha1; is the reader broken?", names)
	}
}
