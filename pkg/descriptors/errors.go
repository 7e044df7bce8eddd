package descriptors

import (
	"sort"
	"strconv"
	"strings"
)

// ConfigError is one validation failure of a config file. Line is 1-based
// and 0 when unknown; Field is the YAML field at fault and may be empty (a
// syntax error, a document that is not a mapping).
type ConfigError struct {
	File  string
	Line  int
	Field string
	Msg   string
}

// Error returns "file:line: field: msg", leaving out the line when it is
// unknown and the field when it is empty.
func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every validation failure of one Load or Parse, sorted by file and
// then line. errors.As finds each *ConfigError in it.
type Errors []*ConfigError

// Error returns the errors' messages, one per line.
func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Unwrap returns the individual errors for errors.Is and errors.As.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

func (es Errors) sort() {
	sort.SliceStable(es, func(i, j int) bool {
		if es[i].File != es[j].File {
			return es[i].File < es[j].File
		}
		return es[i].Line < es[j].Line
	})
}

func (es *Errors) add(file string, line int, fieldName, msg string) {
	*es = append(*es, &ConfigError{File: file, Line: line, Field: fieldName, Msg: msg})
}
