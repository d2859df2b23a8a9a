package recipes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/layercache/layercache/api/v1alpha1"
	"github.com/layercache/layercache/internal/mdcheck"
	"github.com/layercache/layercache/nodeagent/kit"
)

// The Markdown documentation (README.md, the guides, docs/), checked as
// the recipe files are: every link resolves, every YAML block parses, the
// Kubernetes objects in it strictly into their types and, where they ask
// layercache for something, as the node agent reads them; every shell
// block parses and names make targets, files and kubectl verbs that
// exist. The layerfs commands of the shell blocks are checked against the
// CLI itself (cmd/layerfs), the reference's flags against the binary
// (cmd/layercache), its metrics and Events against the code
// (reference_test.go), and the e2e test beside them has the API server
// dry-run the objects.

const repoRoot = "../.."

// readDocs parses every documentation file; a construct the reader does
// not follow fails the test rather than hide a link or a block.
func readDocs(t *testing.T) []mdcheck.Doc {
	t.Helper()
	files, err := mdcheck.Files(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	var docs []mdcheck.Doc
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		d := mdcheck.Parse(f, data)
		for _, p := range d.Problems {
			t.Errorf("%s", p)
		}
		docs = append(docs, d)
	}
	if len(docs) < 10 {
		t.Fatalf("read %d documentation files (%v); want the guides and docs/", len(docs), files)
	}
	return docs
}

// blocks returns the code blocks of the docs in the given languages.
func blocks(t *testing.T, langs ...string) []mdcheck.Block {
	t.Helper()
	var out []mdcheck.Block
	for _, d := range readDocs(t) {
		for _, b := range d.Blocks {
			if slices.Contains(langs, b.Lang) {
				out = append(out, b)
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no %v blocks in the docs", langs)
	}
	return out
}

// checkedLangs are the languages a block may say, each checked below or
// on purpose not: text (trees, listings), go and groovy (snippets of
// files whose context is not in the block).
var checkedLangs = []string{"yaml", "toml", "json", "sh", "text", "go", "groovy"}

func TestDocsCodeBlocksSayTheirLanguage(t *testing.T) {
	for _, d := range readDocs(t) {
		for _, b := range d.Blocks {
			if !slices.Contains(checkedLangs, b.Lang) {
				t.Errorf("%s: the block says %q; say one of %v (sh for commands, text for listings) so that the tests know how to check it", b, b.Lang, checkedLangs)
			}
		}
	}
}

// TestDocsLinksResolve: every relative link names a file or directory of
// the repository, and every #anchor a heading of its Markdown file, by
// GitHub's slug rules.
func TestDocsLinksResolve(t *testing.T) {
	docs := readDocs(t)
	anchors := map[string]map[string]bool{}
	for _, d := range docs {
		anchors[d.File] = d.Anchors
	}
	anchorsOf := func(file string) (map[string]bool, error) {
		if a, ok := anchors[file]; ok {
			return a, nil
		}
		data, err := os.ReadFile(filepath.Join(repoRoot, file))
		if err != nil {
			return nil, err
		}
		anchors[file] = mdcheck.Parse(file, data).Anchors
		return anchors[file], nil
	}
	checked := 0
	for _, d := range docs {
		for _, l := range d.Links {
			if strings.Contains(l.Target, "://") || strings.HasPrefix(l.Target, "mailto:") {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(l.Target, "#")
			file := d.File
			if path != "" {
				if strings.HasPrefix(path, "/") {
					t.Errorf("%s: an absolute path; link relative to the file", l)
					continue
				}
				file = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(d.File), path)))
				if file == ".." || strings.HasPrefix(file, "../") {
					t.Errorf("%s: points outside the repository", l)
					continue
				}
				if _, err := os.Stat(filepath.Join(repoRoot, file)); err != nil {
					t.Errorf("%s: %s does not exist", l, file)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(file, ".md") {
				t.Errorf("%s: an anchor into %s, which is not Markdown; link the file", l, file)
				continue
			}
			a, err := anchorsOf(file)
			if err != nil {
				t.Errorf("%s: %v", l, err)
				continue
			}
			if !a[anchor] {
				t.Errorf("%s: %s has no heading with anchor #%s", l, file, anchor)
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked %d internal links; the docs have more: is the link reader broken?", checked)
	}
}

// yamlDocuments splits a block at its document separators.
func yamlDocuments(text string) []string {
	var docs []string
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(text, -1) {
		if strings.TrimSpace(d) != "" {
			docs = append(docs, d)
		}
	}
	return docs
}

// foreignKinds are the kinds the docs show whose Go types this module does
// not have: they are parsed as YAML, and the recipe tests read the parts of
// them that are Kubernetes types. Another kind fails TestDocsYAMLBlocks.
var foreignKinds = map[string]bool{
	"triggers.tekton.dev/v1beta1 TriggerBinding":  true,
	"triggers.tekton.dev/v1beta1 TriggerTemplate": true,
	"argoproj.io/v1alpha1 Workflow":               true,
	// prometheus-operator's, for the monitoring docs; their rules are
	// checked by promtool where they live.
	"monitoring.coreos.com/v1 PodMonitor":     true,
	"monitoring.coreos.com/v1 ServiceMonitor": true,
	"monitoring.coreos.com/v1 PrometheusRule": true,
}

// docObject is a Kubernetes object of the docs, as the API server would
// get it.
type docObject struct {
	where string
	obj   runtime.Object
}

// docObjects parses every YAML block of the docs: each document as YAML,
// the Kubernetes objects strictly into their types, and the Jobs that a
// block's shell step creates from a here-document too.
func docObjects(t *testing.T) []docObject {
	t.Helper()
	var objs []docObject
	for _, b := range blocks(t, "yaml") {
		for i, text := range yamlDocuments(b.Text) {
			where := fmt.Sprintf("%s, document %d", b, i+1)
			objs = append(objs, parseYAMLDocument(t, where, []byte(text))...)
		}
	}
	return objs
}

var (
	heredocRE = regexp.MustCompile(`(?s)kubectl (?:create|apply) -f - <<'?(\w+)'?\n(.*?)\n\s*(\w+)\n`)
	shellVar  = regexp.MustCompile(`\$\{[A-Za-z_][A-Za-z0-9_]*\}`)
)

func parseYAMLDocument(t *testing.T, where string, data []byte) []docObject {
	t.Helper()
	var generic any
	if err := yaml.Unmarshal(data, &generic); err != nil {
		t.Errorf("%s: not YAML: %v", where, err)
		return nil
	}
	var objs []docObject
	if m, ok := generic.(map[string]any); ok && m["apiVersion"] != nil && m["kind"] != nil {
		if o := parseObject(t, where, data, fmt.Sprint(m["apiVersion"]), fmt.Sprint(m["kind"])); o != nil {
			objs = append(objs, docObject{where, o})
		}
	} else {
		checkAnnotationFragments(t, where, generic)
	}
	// A CI step's script that creates an object from a here-document:
	// the object, with the script's variables given example values.
	walkStrings(generic, func(s string) {
		for _, m := range heredocRE.FindAllStringSubmatch(s+"\n", -1) {
			if m[1] != m[3] {
				continue
			}
			body := shellVar.ReplaceAllString(m[2], "1")
			objs = append(objs, parseYAMLDocument(t, where+", the here-document", []byte(dedent(body)))...)
		}
	})
	return objs
}

func parseObject(t *testing.T, where string, data []byte, apiVersion, kind string) runtime.Object {
	t.Helper()
	strict := func(into any) bool {
		if err := yaml.UnmarshalStrict(data, into); err != nil {
			t.Errorf("%s: %s: %v", where, kind, err)
			return false
		}
		return true
	}
	switch apiVersion + " " + kind {
	case "batch/v1 Job":
		var job batchv1.Job
		if !strict(&job) {
			return nil
		}
		checkPodSpec(t, where, &job.Spec.Template.Spec)
		return &job
	case "v1 Pod":
		var pod corev1.Pod
		if !strict(&pod) {
			return nil
		}
		checkPodSpec(t, where, &pod.Spec)
		return &pod
	case "storage.k8s.io/v1 StorageClass":
		var sc storagev1.StorageClass
		if !strict(&sc) {
			return nil
		}
		if sc.Provisioner == v1alpha1.ProvisionerName {
			if _, err := kit.ParseClass(&sc); err != nil {
				t.Errorf("%s: the node agent refuses the class: %v", where, err)
			}
		}
		return &sc
	case "v1 PersistentVolumeClaim":
		var pvc corev1.PersistentVolumeClaim
		if !strict(&pvc) {
			return nil
		}
		checkClaim(t, where, &pvc, nil)
		return &pvc
	}
	if !foreignKinds[apiVersion+" "+kind] {
		t.Errorf("%s: %s %s is neither parsed into its type here nor among the foreign kinds; add it to one or the other", where, apiVersion, kind)
	}
	return nil
}

// shippedClass is the StorageClass config/ installs as `layercache`.
func shippedClass(t *testing.T) *storagev1.StorageClass {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "config/storage/storageclass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var sc storagev1.StorageClass
	if err := yaml.UnmarshalStrict(data, &sc); err != nil {
		t.Fatal(err)
	}
	return &sc
}

// checkPodSpec reads a pod's layercache volumes as the node agent does:
// a claim template of a layercache class, or a CSI inline volume.
func checkPodSpec(t *testing.T, where string, spec *corev1.PodSpec) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "build", UID: "uid-1"}, Spec: *spec}
	for _, v := range spec.Volumes {
		switch {
		case v.Ephemeral != nil && v.Ephemeral.VolumeClaimTemplate != nil:
			tmpl := v.Ephemeral.VolumeClaimTemplate
			claim := &corev1.PersistentVolumeClaim{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
			claim.Namespace, claim.Name = pod.Namespace, pod.Name+"-"+v.Name
			checkClaim(t, where+", volume "+v.Name, claim, pod)
		case v.CSI != nil && v.CSI.Driver == v1alpha1.CSIDriverName:
			checkCSIVolume(t, where+", volume "+v.Name, pod, v.CSI)
		}
	}
}

// checkClaim parses a claim of the shipped layercache class as the node
// agent does; a claim of another class is not layercache's.
func checkClaim(t *testing.T, where string, claim *corev1.PersistentVolumeClaim, pod *corev1.Pod) {
	t.Helper()
	if claim.Spec.StorageClassName == nil || *claim.Spec.StorageClassName != v1alpha1.StorageClassName {
		return
	}
	class, err := kit.ParseClass(shippedClass(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kit.ParseSettings(kit.ClaimSettings(claim, pod), class); err != nil {
		t.Errorf("%s: the node agent refuses the claim: %v", where, err)
	}
}

// checkCSIVolume parses a CSI inline volume's attributes as the node agent
// does, with its default limits and the shipped class.
func checkCSIVolume(t *testing.T, where string, pod *corev1.Pod, src *corev1.CSIVolumeSource) {
	t.Helper()
	attrs := map[string]string{
		kit.AttrEphemeral: "true", kit.AttrPodNamespace: pod.Namespace, kit.AttrPodName: pod.Name, kit.AttrPodUID: string(pod.UID),
	}
	for k, v := range src.VolumeAttributes {
		attrs[k] = v
	}
	csiPod, err := kit.ParseCSIPod(attrs)
	if err != nil {
		t.Fatal(err)
	}
	readOnly := src.ReadOnly != nil && *src.ReadOnly
	s, err := kit.CSISettings(attrs, csiPod, readOnly, kit.CSILimits{Default: 10 << 30, Max: 100 << 30})
	if err != nil {
		t.Errorf("%s: the node agent refuses the attributes: %v", where, err)
		return
	}
	class, err := kit.CSIClass(attrs, func(name string) (*storagev1.StorageClass, error) {
		if sc := shippedClass(t); sc.Name == name {
			return sc, nil
		}
		return nil, nil
	})
	if err != nil {
		t.Errorf("%s: the node agent refuses the storageClass attribute: %v", where, err)
		return
	}
	if _, err := kit.ParseSettings(s.WithPod(pod, "cache"), class); err != nil {
		t.Errorf("%s: the node agent refuses the volume: %v", where, err)
	}
}

// claimAnnotations are the annotations a user puts on a claim.
var claimAnnotations = []string{v1alpha1.AnnotationCache, v1alpha1.AnnotationFallback, v1alpha1.AnnotationMode, v1alpha1.AnnotationCommit, v1alpha1.AnnotationRelease}

// checkAnnotationFragments finds a claim's annotations shown alone in a
// fragment (a map with layercache.dev/cache) and parses them as a claim's;
// a mode or commit value elsewhere is parsed alone. Other layercache.dev
// keys (a Namespace's labels and annotations) are not a claim's.
func checkAnnotationFragments(t *testing.T, where string, v any) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		annotations := map[string]string{}
		for k, val := range v {
			if slices.Contains(claimAnnotations, k) {
				annotations[k] = fmt.Sprint(val)
			} else {
				checkAnnotationFragments(t, where, val)
			}
		}
		if _, ok := annotations[v1alpha1.AnnotationCache]; !ok {
			if m, ok := annotations[v1alpha1.AnnotationMode]; ok {
				if _, err := v1alpha1.ParseMode(m); err != nil {
					t.Errorf("%s: %v", where, err)
				}
			}
			if c, ok := annotations[v1alpha1.AnnotationCommit]; ok {
				if _, err := v1alpha1.ParseCommitPolicy(c); err != nil {
					t.Errorf("%s: %v", where, err)
				}
			}
			return
		}
		class := v1alpha1.StorageClassName
		claim := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "build", Annotations: annotations},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")},
			}},
		}
		checkClaim(t, where+", the annotations", claim, nil)
	case []any:
		for _, e := range v {
			checkAnnotationFragments(t, where, e)
		}
	}
}

func walkStrings(v any, fn func(string)) {
	switch v := v.(type) {
	case string:
		fn(v)
	case map[string]any:
		for _, e := range v {
			walkStrings(e, fn)
		}
	case []any:
		for _, e := range v {
			walkStrings(e, fn)
		}
	}
}

// dedent removes the indent the first non-empty line has from every line.
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	indent := -1
	for _, l := range lines {
		if strings.TrimSpace(l) != "" {
			indent = len(l) - len(strings.TrimLeft(l, " "))
			break
		}
	}
	for i, l := range lines {
		if len(l) >= indent && indent > 0 {
			lines[i] = l[indent:]
		}
	}
	return strings.Join(lines, "\n")
}

// TestDocsYAMLBlocks parses every YAML block (see docObjects) and wants the
// objects the docs teach with: at least the README's Job, the CSI Job, the
// snapshot class and the BuildKit pod.
func TestDocsYAMLBlocks(t *testing.T) {
	kinds := map[string]int{}
	for _, o := range docObjects(t) {
		kinds[o.obj.GetObjectKind().GroupVersionKind().Kind]++
	}
	for kind, least := range map[string]int{"Job": 3, "Pod": 1, "StorageClass": 1} {
		if kinds[kind] < least {
			t.Errorf("%d %s objects parsed from the docs, want at least %d (all: %v)", kinds[kind], kind, least, kinds)
		}
	}
}

func TestDocsTOMLBlocks(t *testing.T) {
	for _, b := range blocks(t, "toml") {
		var v map[string]any
		if _, err := toml.Decode(b.Text, &v); err != nil {
			t.Errorf("%s: %v", b, err)
		}
	}
}

func TestDocsJSONBlocks(t *testing.T) {
	for _, b := range blocks(t, "json") {
		text := strings.TrimSpace(b.Text)
		if strings.HasPrefix(text, `"`) {
			// One member of a larger object, as e2e/README.md shows
			// cluster.json's registry.
			text = "{" + text + "}"
		}
		if !json.Valid([]byte(text)) {
			t.Errorf("%s: not JSON", b)
		}
	}
}

// makeTargets are the Makefile's targets.
func makeTargets(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*:([^=]|$)`).FindAllStringSubmatch(string(data), -1) {
		for _, name := range strings.Fields(m[1]) {
			targets[name] = true
		}
	}
	if !targets["test"] || !targets["demo"] {
		t.Fatalf("read Makefile targets %v; want test and demo among them", targets)
	}
	return targets
}

// kubectlVerbs are the kubectl commands the docs may use.
var kubectlVerbs = []string{"annotate", "apply", "create", "delete", "describe", "get", "label", "logs", "patch", "wait", "kustomize"}

// TestDocsShellBlocks: every sh block is valid bash (bash -n), its make
// targets exist, its scripts of the repository exist, and its kubectl
// commands use a known verb, a kustomization that exists, files that
// exist and JSON patches that parse. The layerfs commands are checked by
// cmd/layerfs's TestDocsLayerfsCommands.
func TestDocsShellBlocks(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash checks the shell blocks' syntax: %v", err)
	}
	targets := makeTargets(t)
	commands := 0
	for _, b := range blocks(t, "sh") {
		var stderr bytes.Buffer
		cmd := exec.Command(bash, "-n")
		cmd.Stdin, cmd.Stderr = strings.NewReader(b.Text), &stderr
		if err := cmd.Run(); err != nil {
			t.Errorf("%s: bash -n: %v: %s", b, err, stderr.String())
			continue
		}
		cmds, err := mdcheck.Commands(b.Text)
		if err != nil {
			t.Errorf("%s: %v", b, err)
			continue
		}
		for _, c := range cmds {
			commands++
			where := fmt.Sprintf("%s, line %d", b, c.Line)
			args := c.Args
			for len(args) > 0 && regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`).MatchString(args[0]) {
				args = args[1:] // environment assignments
			}
			if len(args) == 0 {
				continue
			}
			switch prog := args[0]; {
			case prog == "make":
				checkMake(t, where, targets, args[1:])
			case prog == "kubectl":
				checkKubectl(t, where, args[1:])
			case strings.Contains(prog, "/") && !strings.HasPrefix(prog, "/") && !strings.HasPrefix(prog, "$"):
				if _, err := os.Stat(filepath.Join(repoRoot, prog)); err != nil {
					t.Errorf("%s: %s is not a file of the repository", where, prog)
				}
			}
		}
	}
	if commands < 30 {
		t.Errorf("read %d commands from the docs' shell blocks; is the reader broken?", commands)
	}
}

func checkMake(t *testing.T, where string, targets map[string]bool, args []string) {
	t.Helper()
	named := 0
	for _, a := range args {
		switch {
		case strings.HasPrefix(a, "-"):
			t.Errorf("%s: make %s: the docs run make from the repository's root without options", where, a)
		case strings.Contains(a, "="):
			// a variable
		case !targets[a]:
			t.Errorf("%s: make %s: the Makefile has no such target", where, a)
		default:
			named++
		}
	}
	if named == 0 {
		t.Errorf("%s: make without a target", where)
	}
}

func checkKubectl(t *testing.T, where string, args []string) {
	t.Helper()
	var verb string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-n" || a == "--namespace":
			i++
		case strings.HasPrefix(a, "-"):
		case verb == "":
			verb = a
		}
	}
	if !slices.Contains(kubectlVerbs, verb) {
		t.Errorf("%s: kubectl %q: not a verb the docs use (%v)", where, verb, kubectlVerbs)
	}
	for i := 0; i+1 < len(args); i++ {
		switch a, v := args[i], args[i+1]; a {
		case "-k":
			if _, err := os.Stat(filepath.Join(repoRoot, v, "kustomization.yaml")); err != nil {
				t.Errorf("%s: kubectl -k %s: no kustomization.yaml there", where, v)
			}
		case "-f":
			if v != "-" && !strings.Contains(v, "://") {
				if _, err := os.Stat(filepath.Join(repoRoot, v)); err != nil {
					t.Errorf("%s: kubectl -f %s: no such file in the repository", where, v)
				}
			}
		case "-p":
			if !json.Valid([]byte(v)) {
				t.Errorf("%s: kubectl %s -p %s: the patch is not JSON", where, verb, v)
			}
		}
	}
}

// sectionRefRE finds a reference to a section of a Markdown file in
// prose or a comment, as code comments, scripts and the docs name the
// section that explains them: (docs/using.md, "Volume layouts"), or
// (README, "Quick start") for the top-level guides.
var sectionRefRE = regexp.MustCompile("`?((?:[A-Za-z0-9_.-]+/)*(?:[A-Za-z0-9_-]+\\.md|README|ARCHITECTURE|DEVELOPERS))`?, +\"([^\"]+)\"")

// TestSectionReferencesExist: every such reference in the repository's
// sources, scripts, manifests and docs names a Markdown file
// that exists (from the repository's root, or beside the file that names
// it) and the start of one of its headings, so that a moved or renamed
// section cannot leave a comment or a help text pointing nowhere.
func TestSectionReferencesExist(t *testing.T) {
	headings := map[string][]string{}
	headingsOf := func(file string) ([]string, error) {
		if h, ok := headings[file]; ok {
			return h, nil
		}
		data, err := os.ReadFile(filepath.Join(repoRoot, file))
		if err != nil {
			return nil, err
		}
		headings[file] = mdcheck.Parse(file, data).Headings
		return headings[file], nil
	}
	// A comment or a paragraph may wrap between the file and the heading,
	// or inside the heading.
	wrap := regexp.MustCompile(`[ \t]*\n[ \t]*(?://|#)?[ \t]*`)
	refs := 0
	err := filepath.WalkDir(repoRoot, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != repoRoot && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "bin" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		ext := filepath.Ext(name)
		if !slices.Contains([]string{".go", ".sh", ".yaml", ".md", ".txt"}, ext) && name != "Makefile" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(repoRoot, path)
		if err != nil {
			return err
		}
		for _, m := range sectionRefRE.FindAllStringSubmatch(wrap.ReplaceAllString(string(data), " "), -1) {
			file, section := m[1], m[2]
			if !strings.HasSuffix(file, ".md") {
				file += ".md" // (README, "Quick start")
			}
			if _, err := os.Stat(filepath.Join(repoRoot, file)); err != nil {
				file = filepath.ToSlash(filepath.Join(filepath.Dir(rel), file))
			}
			refs++
			hs, err := headingsOf(file)
			if err != nil {
				t.Errorf("%s: names %s, %q: no such file", rel, m[1], section)
				continue
			}
			if !slices.ContainsFunc(hs, func(h string) bool { return strings.HasPrefix(h, section) }) {
				t.Errorf("%s: names %s, %q: no heading of %s starts so (%q)", rel, m[1], section, file, hs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if refs < 15 {
		t.Errorf("found %d section references; the sources have more: is the reader broken?", refs)
	}
}
