package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// A documentation test: every grpcurl command in README.md's code blocks
// runs, with the real grpcurl, against a freshly started rls serving the
// shipped config/example.yaml, and prints what the README shows.

// readmeBlock is one fenced code block and the prose just before it.
type readmeBlock struct {
	lang, text, prose string
	line              int
}

// docBlocks returns the fenced code blocks of a Markdown file of the
// repository (a path from the repository's root, such as "README.md").
func docBlocks(t *testing.T, name string) []readmeBlock {
	t.Helper()
	md, err := os.ReadFile(filepath.Join("..", name))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []readmeBlock
	var cur *readmeBlock
	var prose strings.Builder
	for i, line := range strings.Split(string(md), "\n") {
		if strings.HasPrefix(line, "```") {
			if cur == nil {
				cur = &readmeBlock{lang: strings.TrimPrefix(line, "```"), prose: prose.String(), line: i + 1}
				prose.Reset()
			} else {
				blocks = append(blocks, *cur)
				cur = nil
			}
			continue
		}
		if cur != nil {
			cur.text += line + "\n"
		} else {
			prose.WriteString(line + "\n")
		}
	}
	return blocks
}

// shellCommand reads one command from s as a POSIX shell would: words split
// on unquoted blanks, '…' literal, "…" with backslash escapes, a backslash-
// newline joining lines, # starting a comment; it ends at an unquoted
// newline. It returns the
// words and the rest of s.
func shellCommand(s string) (words []string, rest string, err error) {
	var w strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, w.String())
			w.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s) && s[i+1] == '\n':
			i++
		case c == '\\' && i+1 < len(s):
			w.WriteByte(s[i+1])
			inWord = true
			i++
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, "", fmt.Errorf("unterminated ' in %q", s)
			}
			w.WriteString(s[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("$`\"\\\n", s[i+1]) >= 0 {
					i++
				}
				w.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, "", fmt.Errorf("unterminated \" in %q", s)
			}
			inWord = true
		case c == '#' && !inWord: // a comment, to the end of the line
			for i+1 < len(s) && s[i+1] != '\n' {
				i++
			}
		case c == '\n':
			flush()
			return words, s[i+1:], nil
		case c == ' ' || c == '\t':
			flush()
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return words, "", nil
}

// readmeCommand is a grpcurl command and the output the README shows for it.
type readmeCommand struct {
	words  []string
	output string
	line   int
}

// consoleCommands splits a console block into "$ " commands and outputs.
func consoleCommands(t *testing.T, b readmeBlock) []readmeCommand {
	t.Helper()
	var out []readmeCommand
	rest := b.text
	for rest != "" {
		if !strings.HasPrefix(rest, "$ ") {
			t.Fatalf("README.md:%d: console block text outside a command's output: %q", b.line, rest)
		}
		words, after, err := shellCommand(rest[2:])
		if err != nil {
			t.Fatalf("README.md:%d: %v", b.line, err)
		}
		var output strings.Builder
		for after != "" && !strings.HasPrefix(after, "$ ") {
			line, next, _ := strings.Cut(after, "\n")
			output.WriteString(line + "\n")
			after = next
		}
		out = append(out, readmeCommand{words: words, output: strings.TrimSpace(output.String()), line: b.line})
		rest = after
	}
	return out
}

// grpcurlPath finds grpcurl on PATH or in $(go env GOPATH)/bin.
func grpcurlPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	if gp, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(gp)), "bin", "grpcurl")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("grpcurl not found: run make deps")
	return ""
}

var durationRE = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?s$`)

// maskDurations replaces every durationUntilReset (which changes from run
// to run) by a placeholder, after checking it is a JSON duration.
func maskDurations(t *testing.T, v any) any {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if k == "durationUntilReset" {
				if s, _ := e.(string); !durationRE.MatchString(s) {
					t.Errorf("durationUntilReset %v is not a duration", e)
				}
				v[k] = "<duration>"
				continue
			}
			v[k] = maskDurations(t, e)
		}
	case []any:
		for i, e := range v {
			v[i] = maskDurations(t, e)
		}
	}
	return v
}

// sameOutput checks got against the README's text: JSON structurally equal
// but for durations; other text line for line, every line (a service the
// server has and the docs lack is a difference).
func sameOutput(t *testing.T, where, got, want string) {
	t.Helper()
	if strings.HasPrefix(want, "{") {
		var g, w any
		if err := json.Unmarshal([]byte(want), &w); err != nil {
			t.Fatalf("%s: README's output is not JSON: %v", where, err)
		}
		if err := json.Unmarshal([]byte(got), &g); err != nil {
			t.Fatalf("%s: grpcurl printed non-JSON %q: %v", where, got, err)
		}
		if g, w = maskDurations(t, g), maskDurations(t, w); !reflect.DeepEqual(g, w) {
			t.Errorf("%s: grpcurl printed\n%s\nthe README shows\n%s", where, got, want)
		}
		return
	}
	if g, w := nonEmptyLines(got), nonEmptyLines(want); !slices.Equal(g, w) {
		t.Errorf("%s: grpcurl printed\n%s\nthe docs show\n%s", where, strings.Join(g, "\n"), strings.Join(w, "\n"))
	}
}

// nonEmptyLines are s's lines, trimmed, without the empty ones.
func nonEmptyLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

var ordinals = map[string]int{"second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8, "ninth": 9, "tenth": 10}

var ordinalCallRE = regexp.MustCompile(`(?i)\b(second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth) call\b`)

// TestReadmeGrpcurl runs the grpcurl commands of the README and of the docs
// pages that show them, each file's in order against one fresh server. A ```json block whose prose names "the Nth call" is the
// output of the previous command's Nth run; a grpcurl line in a ```sh block
// only has to succeed.
func TestReadmeGrpcurl(t *testing.T) {
	light(t) // processes of its own; asserts counts and memory, not time
	for _, f := range []struct {
		name string
		min  int
	}{{"README.md", 2}, {"docs/envoy.md", 1}, {"docs/kubernetes.md", 1}} {
		t.Run(f.name, func(t *testing.T) { docGrpcurl(t, f.name, f.min) })
	}
}

// docGrpcurl runs one file's grpcurl commands (at least min of them).
func docGrpcurl(t *testing.T, name string, min int) {
	grpcurl := grpcurlPath(t)
	p := startRLS(t, "../config")
	runs := map[string]int{} // command → times run
	var last *readmeCommand
	run := func(c readmeCommand) string {
		t.Helper()
		args := append([]string(nil), c.words[1:]...)
		for i, a := range args {
			if a == "localhost:8081" {
				args[i] = p.GRPCAddr
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, grpcurl, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s:%d: %s: %v\n%s%s", name, c.line, strings.Join(c.words, " "), err, stdout.String(), stderr.String())
		}
		runs[strings.Join(c.words, "\x00")]++
		return strings.TrimSpace(stdout.String())
	}
	ran := 0
	for _, b := range docBlocks(t, name) {
		switch b.lang {
		case "console":
			for _, c := range consoleCommands(t, b) {
				if len(c.words) == 0 || c.words[0] != "grpcurl" {
					continue
				}
				got := run(c)
				ran++
				sameOutput(t, fmt.Sprintf("%s:%d: %s", name, c.line, strings.Join(c.words, " ")), got, c.output)
				last = &c
			}
		case "sh", "bash", "shell":
			rest := b.text
			for rest != "" {
				words, after, err := shellCommand(rest)
				if err != nil {
					t.Fatalf("%s:%d: %v", name, b.line, err)
				}
				rest = after
				if len(words) > 0 && words[0] == "grpcurl" {
					run(readmeCommand{words: words, line: b.line})
					ran++
				}
			}
		case "json":
			m := ordinalCallRE.FindStringSubmatch(b.prose)
			if m == nil || last == nil {
				continue
			}
			n := ordinals[strings.ToLower(m[1])]
			key := strings.Join(last.words, "\x00")
			if runs[key] >= n {
				t.Fatalf("%s:%d: the %s call: the command already ran %d times", name, b.line, m[1], runs[key])
			}
			var got string
			for runs[key] < n {
				got = run(*last)
			}
			sameOutput(t, fmt.Sprintf("%s:%d: the %s call of %s", name, b.line, m[1], strings.Join(last.words, " ")), got, strings.TrimSpace(b.text))
		}
	}
	if ran < min {
		t.Fatalf("ran %d grpcurl commands from %s, want at least %d", ran, name, min)
	}
}
