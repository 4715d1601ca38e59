// talos-machinery runs Talos's own config code (github.com/siderolabs/talos/pkg/machinery, pinned in go.mod)
// for the lab and the tests, so that neither has to imitate it:
//
//	talos-machinery check [--installed]      decode and validate a machine config read from stdin, as a node's
//	                                          ApplyConfiguration does (configloader.NewFromBytes, then Validate)
//	talos-machinery diff                      the config diff a dry run answers (configdiff.DiffConfigs), unredacted
//	                                          as Talos sends it, of {"old": TEXT, "new": TEXT} read from stdin
//	                                          ("old" empty or absent: the node has no config yet)
//	talos-machinery redacted-paths KIND...    for each document kind, the YAML paths whose values Talos's own
//	                                          Redact replaces (found by filling every field of the document and
//	                                          comparing it before and after Redact); kinds the decoder does not
//	                                          know are listed apart, with its error
//
// Every answer is one JSON object on stdout; the exit code is 0 unless the tool itself could not run.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"reflect"
	"sort"
	"strings"

	yaml "go.yaml.in/yaml/v4"

	"github.com/siderolabs/talos/pkg/machinery/config"
	coreconfig "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configdiff"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
)

// metalMode is the validation mode of a Proxmox VM running Talos from its disk: the node's
// runtime.ModeMetal, which requires an install unless Talos is installed already (the modeWrapper of
// internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go).
type metalMode struct{ installed bool }

func (metalMode) String() string          { return "metal" }
func (m metalMode) RequiresInstall() bool { return !m.installed }
func (metalMode) InContainer() bool       { return false }

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: talos-machinery check [--installed] | diff | redacted-paths KIND..."))
	}

	var (
		answer any
		err    error
	)

	switch os.Args[1] {
	case "check":
		answer, err = check(os.Stdin, len(os.Args) > 2 && os.Args[2] == "--installed")
	case "diff":
		answer, err = diff(os.Stdin)
	case "redacted-paths":
		answer, err = redactedPaths(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}

	if err != nil {
		fail(err)
	}

	if err = json.NewEncoder(os.Stdout).Encode(answer); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "talos-machinery:", err)
	os.Exit(2)
}

type checkAnswer struct {
	Error    string   `json:"error,omitempty"`
	Stage    string   `json:"stage,omitempty"`
	Warnings []string `json:"warnings"`
	Kinds    []string `json:"kinds"`
	V1Alpha1 bool     `json:"v1alpha1"`
}

func check(in io.Reader, installed bool) (checkAnswer, error) {
	answer := checkAnswer{Warnings: []string{}, Kinds: []string{}}

	data, err := io.ReadAll(in)
	if err != nil {
		return answer, err
	}

	provider, err := configloader.NewFromBytes(data)
	if err != nil {
		answer.Error, answer.Stage = err.Error(), "decode"

		return answer, nil
	}

	for _, doc := range provider.Documents() {
		answer.Kinds = append(answer.Kinds, doc.Kind())
	}

	answer.V1Alpha1 = provider.RawV1Alpha1() != nil

	warnings, err := provider.Validate(metalMode{installed: installed})
	answer.Warnings = append(answer.Warnings, warnings...)

	if err != nil {
		answer.Error, answer.Stage = err.Error(), "validate"
	}

	return answer, nil
}

type diffAnswer struct {
	Diff string `json:"diff"`
}

func load(text string) (config.Provider, error) {
	if text == "" {
		return nil, nil //nolint:nilnil
	}

	return configloader.NewFromBytes([]byte(text))
}

func diff(in io.Reader) (diffAnswer, error) {
	var texts struct {
		Old string `json:"old"`
		New string `json:"new"`
	}

	if err := json.NewDecoder(in).Decode(&texts); err != nil {
		return diffAnswer{}, err
	}

	oldCfg, err := load(texts.Old)
	if err != nil {
		return diffAnswer{}, fmt.Errorf("old config: %w", err)
	}

	newCfg, err := load(texts.New)
	if err != nil {
		return diffAnswer{}, fmt.Errorf("new config: %w", err)
	}

	var oldEncoder, newEncoder coreconfig.Encoder

	if oldCfg != nil {
		oldEncoder = oldCfg
	}

	if newCfg != nil {
		newEncoder = newCfg
	}

	text, err := configdiff.DiffConfigs(oldEncoder, newEncoder)

	return diffAnswer{Diff: text}, err
}

// --- redacted-paths ------------------------------------------------------------------------------

const replacement = "talos-machinery-redacted"

// document returns a fresh document of a kind, made by Talos's own decoder (the registry of kinds is
// internal to machinery; decoding "apiVersion/kind" is its public way in).
func document(kind string) (any, error) {
	if kind == "v1alpha1" {
		return &v1alpha1.Config{}, nil
	}

	provider, err := configloader.NewFromBytes([]byte("apiVersion: v1alpha1\nkind: " + kind + "\n"))
	if err != nil {
		return nil, err
	}

	for _, doc := range provider.Documents() {
		if doc.Kind() == kind {
			return doc.Clone(), nil
		}
	}

	return nil, fmt.Errorf("kind %s: the decoder made no such document", kind)
}

// redact runs the document's own Redact, if its kind has one.
func redact(doc any) {
	switch typed := doc.(type) {
	case *v1alpha1.Config:
		typed.Redact(replacement)
	case coreconfig.SecretDocument:
		typed.Redact(replacement)
	}
}

type redactedAnswer struct {
	Paths map[string][]string `json:"paths"`
	// Unknown maps a kind the decoder does not know to its error.
	Unknown map[string]string `json:"unknown"`
}

func redactedPaths(kinds []string) (redactedAnswer, error) {
	answer := redactedAnswer{Paths: map[string][]string{}, Unknown: map[string]string{}}

	for _, kind := range kinds {
		before, err := document(kind)
		if err != nil {
			answer.Unknown[kind] = err.Error()

			continue
		}

		after, err := document(kind)
		if err != nil {
			return answer, err
		}

		fill(reflect.ValueOf(before), 0)
		fill(reflect.ValueOf(after), 0)

		redact(after)

		encodedBefore, err := encoded(before)
		if err != nil {
			return answer, fmt.Errorf("kind %s: %w", kind, err)
		}

		encodedAfter, err := encoded(after)
		if err != nil {
			return answer, fmt.Errorf("kind %s: %w", kind, err)
		}

		found := map[string]bool{}
		compare(encodedBefore, encodedAfter, nil, found)

		paths := make([]string, 0, len(found))
		for path := range found {
			paths = append(paths, path)
		}

		sort.Strings(paths)
		answer.Paths[kind] = paths
	}

	return answer, nil
}

var urlType = reflect.TypeFor[url.URL]()

// filledKey is the key fill() gives the one entry of a map.
const filledKey = "filled-key"

// fill gives every settable field a non-empty value, so that a Redact that skips empty values still
// shows what it would replace. A URL gets the query parameter SideroLink's Redact looks for.
func fill(value reflect.Value, depth int) {
	if depth > 16 {
		return
	}

	switch value.Kind() { //nolint:exhaustive
	case reflect.Pointer:
		if value.IsNil() {
			if !value.CanSet() {
				return
			}

			value.Set(reflect.New(value.Type().Elem()))
		}

		fill(value.Elem(), depth+1)
	case reflect.Struct:
		if value.Type() == urlType {
			parsed, _ := url.Parse("https://fill.invalid/?jointoken=filled-token") //nolint:errcheck
			value.Set(reflect.ValueOf(*parsed))

			return
		}

		for i := range value.NumField() {
			if value.Type().Field(i).IsExported() {
				fill(value.Field(i), depth+1)
			}
		}
	case reflect.String:
		if value.CanSet() {
			value.SetString("filled")
		}
	case reflect.Slice:
		if !value.CanSet() {
			return
		}

		if value.Type().Elem().Kind() == reflect.Uint8 {
			value.SetBytes([]byte("filled"))

			return
		}

		slice := reflect.MakeSlice(value.Type(), 1, 1)
		fill(slice.Index(0), depth+1)
		value.Set(slice)
	case reflect.Map:
		if !value.CanSet() || value.Type().Key().Kind() != reflect.String {
			return
		}

		entries := reflect.MakeMap(value.Type())
		item := reflect.New(value.Type().Elem()).Elem()
		fill(item, depth+1)
		entries.SetMapIndex(reflect.ValueOf(filledKey).Convert(value.Type().Key()), item)
		value.Set(entries)
	case reflect.Bool:
		if value.CanSet() {
			value.SetBool(true)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if value.CanSet() {
			value.SetInt(1)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if value.CanSet() {
			value.SetUint(1)
		}
	}
}

// encoded is a document as Talos writes it (encoder.NewEncoder, comments off), read back as plain
// YAML data: the paths found are the keys a user writes.
func encoded(doc any) (any, error) {
	text, err := encoder.NewEncoder(doc, encoder.WithComments(encoder.CommentsDisabled)).Encode()
	if err != nil {
		return nil, err
	}

	var data any

	err = yaml.Unmarshal(text, &data)

	return data, err
}

// compare records the YAML path of every value that differs between before and after ('*' for any
// list item or map key; a value that is text in one and not in the other is a leaf).
func compare(before, after any, path []string, found map[string]bool) {
	child := func(key string) []string { return append(append([]string{}, path...), key) }

	switch typed := before.(type) {
	case map[string]any:
		other, ok := after.(map[string]any)
		if !ok {
			found[strings.Join(path, ".")] = true

			return
		}

		keys := make([]string, 0, len(typed))
		for key := range typed {
			keys = append(keys, key)
		}

		for _, key := range keys {
			name := key
			if key == filledKey {
				name = "*"
			}

			compare(typed[key], other[key], child(name), found)
		}
	case []any:
		other, ok := after.([]any)
		if !ok || len(other) != len(typed) {
			found[strings.Join(path, ".")] = true

			return
		}

		for i := range typed {
			compare(typed[i], other[i], child("*"), found)
		}
	default:
		if !reflect.DeepEqual(before, after) {
			found[strings.Join(path, ".")] = true
		}
	}
}
