// Package mdcheck reads the project's Markdown documentation as the tests
// that check it need: its fenced code blocks (to parse the YAML, run the
// shell through a parser, find the make targets and CLI commands they
// name), its relative links and the anchors its headings make on GitHub.
//
// It is a reader for tests, not a Markdown renderer: it knows fenced code
// blocks, ATX headings (`## ...`), inline links `[text](target)` outside
// code, and inline code spans, which is all the project's docs use. Setext
// headings, reference-style links and indented code blocks are not used;
// Parse reports the first two so that they cannot slip past the link check.
package mdcheck

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// Files returns the documentation files under root, relative to it: the
// top-level guides, the e2e and config READMEs and every Markdown file
// under docs/. A missing top-level guide is an error: the list names what
// must exist.
func Files(root string) ([]string, error) {
	files := []string{"README.md", "ARCHITECTURE.md", "DEVELOPERS.md", "e2e/README.md", "e2e/bench/README.md", "config/README.md"}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			return nil, err
		}
	}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	return files, err
}

// Block is a fenced code block.
type Block struct {
	File string // as given to Parse
	Line int    // of the opening fence, 1-based
	Lang string // the info string's first word, lower-cased; "" if none
	Text string // the content, without the fences and the fence's indent
}

func (b Block) String() string { return fmt.Sprintf("%s:%d (```%s)", b.File, b.Line, b.Lang) }

// Link is an inline link or image outside code.
type Link struct {
	File   string
	Line   int
	Target string // as written, without a title
}

func (l Link) String() string { return fmt.Sprintf("%s:%d: (%s)", l.File, l.Line, l.Target) }

// Doc is one Markdown file, read.
type Doc struct {
	File    string
	Blocks  []Block
	Links   []Link
	Anchors map[string]bool // the heading anchors GitHub makes
	// Headings are the headings' text as rendered (HeadingText).
	Headings []string
	// Problems are constructs this reader does not follow (an unclosed
	// fence, a setext heading, a reference-style link definition), which
	// would hide links or blocks from the checks.
	Problems []string
}

var (
	fenceRE   = regexp.MustCompile("^( {0,3})(```+|~~~+)\\s*([^`\\s]*)")
	headingRE = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	setextRE  = regexp.MustCompile(`^ {0,3}(=+|-+)\s*$`)
	refDefRE  = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*\S`)
	codeRE    = regexp.MustCompile("(`+)(.+?)(`+)")
	// linkRE finds [text](target) and ![alt](target); the text may hold
	// inline code, not brackets.
	linkRE = regexp.MustCompile(`!?\[([^\[\]]*)\]\(\s*<?([^()\s<>]*)>?(?:\s+"[^"]*")?\s*\)`)
)

// Parse reads one Markdown file's blocks, links and heading anchors.
func Parse(file string, data []byte) Doc {
	d := Doc{File: file, Anchors: map[string]bool{}}
	slugs := map[string]int{}
	var (
		inBlock  bool
		fence    string
		indent   int
		block    Block
		body     []string
		prevText string // the previous line, if it was a paragraph line
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if inBlock {
			if t := strings.TrimLeft(line, " "); strings.HasPrefix(t, fence) && strings.Trim(t, fence[:1]+" ") == "" && len(strings.TrimRight(t, " ")) >= len(fence) {
				block.Text = strings.Join(body, "\n")
				if len(body) > 0 {
					block.Text += "\n"
				}
				d.Blocks = append(d.Blocks, block)
				inBlock = false
				continue
			}
			// Content lines lose up to the fence's indent.
			trim := 0
			for trim < indent && trim < len(line) && line[trim] == ' ' {
				trim++
			}
			body = append(body, line[trim:])
			continue
		}
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			inBlock, indent, fence = true, len(m[1]), m[2]
			block = Block{File: file, Line: n, Lang: strings.ToLower(m[3])}
			body = nil
			prevText = ""
			continue
		}
		if m := headingRE.FindStringSubmatch(line); m != nil {
			d.Headings = append(d.Headings, HeadingText(m[2]))
			slug := Slug(m[2])
			if i := slugs[slug]; i > 0 {
				d.Anchors[fmt.Sprintf("%s-%d", slug, i)] = true
			} else {
				d.Anchors[slug] = true
			}
			slugs[slug]++
			prevText = ""
			continue
		}
		if setextRE.MatchString(line) && prevText != "" && !strings.HasPrefix(strings.TrimSpace(prevText), "|") && !strings.HasPrefix(strings.TrimSpace(prevText), "-") {
			d.Problems = append(d.Problems, fmt.Sprintf("%s:%d: a setext heading (text underlined with = or -); write it as a # heading so that its anchor is checked", file, n))
		}
		if refDefRE.MatchString(line) {
			d.Problems = append(d.Problems, fmt.Sprintf("%s:%d: a reference-style link definition; write the link inline so that it is checked", file, n))
		}
		for _, m := range linkRE.FindAllStringSubmatch(codeRE.ReplaceAllString(line, ""), -1) {
			d.Links = append(d.Links, Link{File: file, Line: n, Target: m[2]})
		}
		if strings.TrimSpace(line) == "" {
			prevText = ""
		} else {
			prevText = line
		}
	}
	if inBlock {
		d.Problems = append(d.Problems, fmt.Sprintf("%s:%d: a code fence that is never closed", file, block.Line))
	}
	return d
}

// Slug is the anchor GitHub gives a heading: its text as rendered
// (inline code keeps its content, links their text, emphasis markers go),
// lower-cased, with every character but letters, digits, spaces, hyphens
// and underscores removed and each space made a hyphen. A repeated slug
// gets -1, -2, ... (Parse adds those).
func Slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(HeadingText(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// HeadingText is a heading's text as rendered: inline code keeps its
// content, links their text, emphasis markers go.
func HeadingText(heading string) string {
	text := linkRE.ReplaceAllString(heading, "$1")
	return strings.NewReplacer("`", "", "**", "", "__", "").Replace(text)
}

// Command is one simple command of a shell block: its words, with quotes
// removed, and the line it starts on.
type Command struct {
	Line int // within the block, 1-based
	Args []string
}

// Commands splits a shell block into simple commands: lines joined at a
// trailing backslash, comments dropped, split at `&&`, `||`, `;` and `|`
// outside quotes. A here-document's body is skipped. Variable references
// and command substitutions stay as written; quotes are removed. It
// expects a block that `bash -n` accepts.
func Commands(script string) ([]Command, error) {
	var cmds []Command
	lines := strings.Split(script, "\n")
	for i := 0; i < len(lines); i++ {
		start := i + 1
		line := lines[i]
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, `\`) + " " + lines[i]
		}
		words, heredoc, err := splitWords(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", start, err)
		}
		if heredoc != "" {
			for i+1 < len(lines) && strings.TrimSpace(lines[i+1]) != heredoc {
				i++
			}
			i++ // the delimiter
		}
		var cur []string
		for _, w := range words {
			if slices.Contains([]string{"&&", "||", ";", "|"}, w.text) && !w.quoted {
				if len(cur) > 0 {
					cmds = append(cmds, Command{Line: start, Args: cur})
				}
				cur = nil
				continue
			}
			cur = append(cur, w.text)
		}
		if len(cur) > 0 {
			cmds = append(cmds, Command{Line: start, Args: cur})
		}
	}
	return cmds, nil
}

type word struct {
	text   string
	quoted bool
}

// splitWords splits one logical line into words and operators. It returns
// the delimiter of a here-document the line starts, if any.
func splitWords(line string) (words []word, heredoc string, err error) {
	var (
		cur    strings.Builder
		inWord bool
		quoted bool
	)
	flush := func() {
		if inWord {
			words = append(words, word{cur.String(), quoted})
		}
		cur.Reset()
		inWord, quoted = false, false
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '#' && !inWord:
			i = len(line)
		case c == ' ' || c == '\t':
			flush()
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, "", fmt.Errorf("unclosed single quote")
			}
			cur.WriteString(line[i+1 : i+1+j])
			inWord, quoted = true, true
			i += j + 1
		case c == '"':
			j := i + 1
			for ; j < len(line) && line[j] != '"'; j++ {
				if line[j] == '\\' && j+1 < len(line) {
					j++
				}
			}
			if j >= len(line) {
				return nil, "", fmt.Errorf("unclosed double quote")
			}
			cur.WriteString(strings.NewReplacer(`\"`, `"`, `\\`, `\`, `\$`, `$`).Replace(line[i+1 : j]))
			inWord, quoted = true, true
			i = j
		case c == '\\' && i+1 < len(line):
			cur.WriteByte(line[i+1])
			inWord = true
			i++
		case c == '<' && strings.HasPrefix(line[i:], "<<") && !inWord:
			flush()
			rest := strings.TrimLeft(line[i+2:], "-")
			rest = strings.TrimLeft(rest, " ")
			end := strings.IndexAny(rest, " ;|&")
			if end < 0 {
				end = len(rest)
			}
			heredoc = strings.Trim(rest[:end], `'"`)
			i = len(line) - len(rest) + end - 1
		case (c == '&' || c == '|') && i+1 < len(line) && line[i+1] == c:
			flush()
			words = append(words, word{text: line[i : i+2]})
			i++
		case c == ';' || c == '|':
			flush()
			words = append(words, word{text: string(c)})
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return words, heredoc, nil
}
