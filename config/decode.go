package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Document is one decoded YAML document: its key, origin and typed value
// (*Gateway, *EndpointPickerConfig, *ConfigMap, *InferencePool,
// *ModelRewrite, *Tenant, *Topology or *StaticEndpoints).
type Document struct {
	Object
	APIVersion string
	Value      any
}

// kindInfo says which API versions a kind accepts and how to allocate it.
type kindInfo struct {
	versions []string
	alloc    func() any
}

var kinds = map[string]kindInfo{
	KindGateway:         {[]string{MeridianV1Alpha1, HyperPodV1Alpha1}, func() any { return new(Gateway) }},
	KindEndpointPicker:  {[]string{GIEEPPConfigV1Alp1}, func() any { return new(EndpointPickerConfig) }},
	KindConfigMap:       {[]string{CoreV1}, func() any { return new(ConfigMap) }},
	KindInferencePool:   {[]string{GIEPoolV1}, func() any { return new(InferencePool) }},
	KindModelRewrite:    {[]string{GIEXV1Alpha2}, func() any { return new(ModelRewrite) }},
	KindTenant:          {[]string{MeridianV1Alpha1}, func() any { return new(Tenant) }},
	KindTopology:        {[]string{MeridianV1Alpha1}, func() any { return new(Topology) }},
	KindStaticEndpoints: {[]string{MeridianV1Alpha1}, func() any { return new(StaticEndpoints) }},
	KindObjective:       {[]string{GIEXV1Alpha2, GIEPoolV1}, func() any { return new(InferenceObjective) }},
}

// Kinds returns the kinds Meridian reads, sorted.
func Kinds() []string {
	return slices.Sorted(maps.Keys(kinds))
}

// Decode splits a multi-document YAML stream and decodes every document
// strictly. origin names the stream in errors (a file path or etcd key).
// It returns every document it could decode and every error it found.
func Decode(origin string, data []byte) ([]Document, Errors) {
	var docs []Document
	var errs Errors
	for _, part := range splitDocuments(data) {
		doc, err := decodeOne(origin, part.line, part.body)
		errs = append(errs, err...)
		if doc != nil {
			docs = append(docs, *doc)
		}
	}
	return docs, errs
}

type docPart struct {
	line int
	body []byte
}

// splitDocuments splits on lines that are exactly "---" (optionally with a
// trailing comment), keeping each document's first line number.
func splitDocuments(data []byte) []docPart {
	var parts []docPart
	lines := bytes.SplitAfter(data, []byte("\n"))
	start, cur := 1, []byte(nil)
	for i, ln := range lines {
		t := bytes.TrimRight(ln, "\r\n")
		if bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- #")) {
			parts = append(parts, docPart{start, cur})
			cur, start = nil, i+2
			continue
		}
		cur = append(cur, ln...)
	}
	parts = append(parts, docPart{start, cur})
	return parts
}

func decodeOne(origin string, line int, body []byte) (*Document, Errors) {
	if len(bytes.TrimSpace(stripComments(body))) == 0 {
		return nil, nil // empty document
	}
	where := origin
	if line > 1 {
		where = fmt.Sprintf("%s:%d", origin, line)
	}
	js, err := yaml.YAMLToJSON(body)
	if err != nil {
		return nil, Errors{{Origin: where, Msg: "invalid YAML: " + err.Error()}}
	}
	var generic any
	if err := json.Unmarshal(js, &generic); err != nil {
		return nil, Errors{{Origin: where, Msg: "invalid document: " + err.Error()}}
	}
	m, ok := generic.(map[string]any)
	if !ok {
		return nil, Errors{{Origin: where, Msg: "a document must be a mapping with apiVersion, kind, metadata"}}
	}
	kind, _ := m["kind"].(string)
	apiVersion, _ := m["apiVersion"].(string)
	name := ""
	if md, ok := m["metadata"].(map[string]any); ok {
		name, _ = md["name"].(string)
	}
	obj := ObjectKey{Kind: kind, Name: name}
	fe := func(path, msg string) Errors {
		return Errors{{Origin: where, Object: obj.String(), Path: path, Msg: msg}}
	}
	if kind == "" {
		return nil, fe("kind", "required; one of "+strings.Join(Kinds(), ", "))
	}
	info, ok := kinds[kind]
	if !ok {
		return nil, fe("kind", fmt.Sprintf("unknown kind %q; want one of %s", kind, strings.Join(Kinds(), ", ")))
	}
	if !contains(info.versions, apiVersion) {
		return nil, fe("apiVersion", fmt.Sprintf("%q is not served for %s; want %s", apiVersion, kind, strings.Join(info.versions, " or ")))
	}
	// EndpointPickerConfig has no metadata in GIE's files; everything else
	// needs a name.
	if name == "" && kind != KindEndpointPicker {
		return nil, fe("metadata.name", "required")
	}
	v := info.alloc()
	var out Errors
	onlyUnknown := true
	for _, e := range checkShape("", generic, reflect.TypeOf(v).Elem()) {
		out = append(out, FieldError{Origin: where, Object: obj.String(), Path: e.path, Msg: e.msg})
		onlyUnknown = onlyUnknown && e.unknown
	}
	if !onlyUnknown {
		return nil, out
	}
	// With only unknown fields wrong, decode the rest so validation can
	// report its problems in the same run; the errors still reject it.
	dec := json.NewDecoder(bytes.NewReader(js))
	if len(out) == 0 {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		// checkShape should have caught it; keep the decoder's word.
		return nil, append(out, fe("", err.Error())...)
	}
	canon, _ := json.Marshal(v)
	return &Document{
		Object:     Object{Key: obj, Origin: origin, Line: line, JSON: canon},
		APIVersion: apiVersion,
		Value:      v,
	}, out
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, ln := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(ln); len(t) > 0 && t[0] != '#' {
			out = append(out, ln...)
			out = append(out, '\n')
		}
	}
	return out
}

type shapeErr struct {
	path, msg string
	unknown   bool // an unknown field; the rest of the document still decodes
}

var (
	rawMessageType = reflect.TypeOf(json.RawMessage(nil))
	durationType   = reflect.TypeOf(Duration(0))
)

// checkShape walks a generic JSON value against a Go type and reports
// unknown fields and type mismatches with their full path, which
// encoding/json cannot do on its own.
func checkShape(path string, v any, t reflect.Type) []shapeErr {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v == nil {
		return nil // null leaves the zero value
	}
	switch {
	case t == rawMessageType:
		return nil
	case t == durationType:
		s, ok := v.(string)
		if !ok {
			return []shapeErr{{path: path, msg: fmt.Sprintf("want a duration string such as \"1m\", got %s", jsonKind(v))}}
		}
		var d Duration
		if err := d.UnmarshalJSON([]byte(strconv.Quote(s))); err != nil {
			return []shapeErr{{path: path, msg: err.Error()}}
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return []shapeErr{{path: path, msg: "want a mapping, got " + jsonKind(v)}}
		}
		fields := jsonFields(t)
		var errs []shapeErr
		for _, k := range slices.Sorted(maps.Keys(m)) {
			f, ok := fields[k]
			if !ok {
				errs = append(errs, shapeErr{join(path, k), fmt.Sprintf("strict decoding error: unknown field %q", k), true})
				continue
			}
			errs = append(errs, checkShape(join(path, k), m[k], f)...)
		}
		return errs
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return []shapeErr{{path: path, msg: "want a mapping, got " + jsonKind(v)}}
		}
		var errs []shapeErr
		for _, k := range slices.Sorted(maps.Keys(m)) {
			errs = append(errs, checkShape(join(path, k), m[k], t.Elem())...)
		}
		return errs
	case reflect.Slice:
		s, ok := v.([]any)
		if !ok {
			return []shapeErr{{path: path, msg: "want a list, got " + jsonKind(v)}}
		}
		var errs []shapeErr
		for i, e := range s {
			errs = append(errs, checkShape(fmt.Sprintf("%s[%d]", path, i), e, t.Elem())...)
		}
		return errs
	case reflect.String:
		if _, ok := v.(string); !ok {
			return []shapeErr{{path: path, msg: "want a string, got " + jsonKind(v)}}
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return []shapeErr{{path: path, msg: "want true or false, got " + jsonKind(v)}}
		}
	case reflect.Int, reflect.Int64, reflect.Int32:
		f, ok := v.(float64)
		if !ok {
			return []shapeErr{{path: path, msg: "want an integer, got " + jsonKind(v)}}
		}
		if f != float64(int64(f)) {
			return []shapeErr{{path: path, msg: fmt.Sprintf("want an integer, got %v", f)}}
		}
	case reflect.Float64, reflect.Float32:
		if _, ok := v.(float64); !ok {
			return []shapeErr{{path: path, msg: "want a number, got " + jsonKind(v)}}
		}
	}
	return nil
}

func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := make(map[string]reflect.Type, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func jsonKind(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("string %q", x)
	case float64:
		return "number " + strconv.FormatFloat(x, 'g', -1, 64)
	case bool:
		return "boolean"
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	}
	return fmt.Sprintf("%T", v)
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
