// Package envoy validates the Envoy and Istio configuration that rls ships in
// this directory (envoy.yaml, envoy-tcp.yaml, envoy-rlqs.yaml, istio/*.yaml) against Envoy's own
// protos, without an Envoy binary: YAML is converted to JSON and unmarshalled
// into go-control-plane's messages with unknown fields rejected, every
// typed_config's "@type" is resolved through the global protobuf registry, and
// protoc-gen-validate's ValidateAll runs on the message and on every message
// packed in a google.protobuf.Any inside it.
package envoy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	// Every extension the shipped files name in a typed_config: the registry
	// must know them for "@type" to resolve.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// YAMLToJSON converts one YAML document to JSON. Duplicate keys are an error
// (yaml.v3 rejects them), and so are non-string mapping keys.
func YAMLToJSON(y []byte) ([]byte, error) {
	var v any
	if err := yaml.Unmarshal(y, &v); err != nil {
		return nil, err
	}
	v, err := jsonable(v, "")
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// jsonable turns yaml.v3's decoded values into values encoding/json accepts.
func jsonable(v any, path string) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			c, err := jsonable(e, path+"."+k)
			if err != nil {
				return nil, err
			}
			v[k] = c
		}
		return v, nil
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("%s: mapping key %v is not a string", path, k)
			}
			c, err := jsonable(e, path+"."+ks)
			if err != nil {
				return nil, err
			}
			m[ks] = c
		}
		return m, nil
	case []any:
		for i, e := range v {
			c, err := jsonable(e, fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			v[i] = c
		}
		return v, nil
	default:
		return v, nil
	}
}

// UnmarshalYAML decodes Envoy YAML into m: unknown fields, unknown enum
// names and "@type" URLs the registry does not know are errors.
func UnmarshalYAML(y []byte, m proto.Message) error {
	j, err := YAMLToJSON(y)
	if err != nil {
		return err
	}
	return unmarshalJSON(j, m)
}

func unmarshalJSON(j []byte, m proto.Message) error {
	return protojson.UnmarshalOptions{DiscardUnknown: false, Resolver: protoregistry.GlobalTypes}.Unmarshal(j, m)
}

// LoadBootstrap decodes an Envoy bootstrap file and validates it (Validate).
func LoadBootstrap(y []byte) (*bootstrapv3.Bootstrap, error) {
	b := &bootstrapv3.Bootstrap{}
	if err := UnmarshalYAML(y, b); err != nil {
		return nil, err
	}
	if err := Validate(b); err != nil {
		return nil, err
	}
	return b, nil
}

type validatorAll interface{ ValidateAll() error }

// Validate runs ValidateAll on m and on every message packed in an Any
// anywhere inside it (recursively), joining every error found.
func Validate(m proto.Message) error {
	var errs []error
	if v, ok := m.(validatorAll); ok {
		if err := v.ValidateAll(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().FullName(), err))
		}
	}
	errs = append(errs, validateAnys(m.ProtoReflect(), string(m.ProtoReflect().Descriptor().Name())))
	return errors.Join(errs...)
}

// validateFields is Validate for a partial message (an EnvoyFilter MERGE
// patch): the message's own required fields are not checked; a singular
// message field is itself partial (checked the same way), while list
// elements, map values and Any contents, which a merge adds whole, are
// validated whole.
func validateFields(m proto.Message) error {
	var errs []error
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() == nil {
			return true
		}
		switch {
		case fd.IsList():
			for i := 0; i < v.List().Len(); i++ {
				errs = append(errs, Validate(v.List().Get(i).Message().Interface()))
			}
		case fd.IsMap():
			v.Map().Range(func(_ protoreflect.MapKey, e protoreflect.Value) bool {
				if fd.MapValue().Message() != nil {
					errs = append(errs, Validate(e.Message().Interface()))
				}
				return true
			})
		case fd.Message().FullName() == "google.protobuf.Any":
			errs = append(errs, validateAnys(v.Message(), string(fd.Name())))
		default:
			errs = append(errs, validateFields(v.Message().Interface()))
		}
		return true
	})
	return errors.Join(errs...)
}

// validateAnys finds every Any under m, unpacks it and validates the content.
func validateAnys(m protoreflect.Message, path string) error {
	var errs []error
	if m.Descriptor().FullName() == "google.protobuf.Any" {
		a := m.Interface().(*anypb.Any)
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%s: %s: %w", path, a.GetTypeUrl(), err)
		}
		if err := Validate(inner); err != nil {
			return fmt.Errorf("%s (%s): %w", path, a.GetTypeUrl(), err)
		}
		return nil
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				errs = append(errs, validateAnys(v.List().Get(i).Message(), fmt.Sprintf("%s[%d]", p, i)))
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(k protoreflect.MapKey, e protoreflect.Value) bool {
				errs = append(errs, validateAnys(e.Message(), fmt.Sprintf("%s[%v]", p, k.Interface())))
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			errs = append(errs, validateAnys(v.Message(), p))
		}
		return true
	})
	return errors.Join(errs...)
}

// EnvoyFilterPatch is one configPatches entry of an Istio EnvoyFilter, its
// value decoded into the Envoy message its applyTo names.
type EnvoyFilterPatch struct {
	Filter    string // metadata.name of the EnvoyFilter
	ApplyTo   string
	Operation string
	Value     proto.Message
}

// patchTypes maps an EnvoyFilter applyTo to the Envoy message of its value.
var patchTypes = map[string]func() proto.Message{
	"HTTP_FILTER":  func() proto.Message { return &hcmv3.HttpFilter{} },
	"VIRTUAL_HOST": func() proto.Message { return &routev3.VirtualHost{} },
	"HTTP_ROUTE":   func() proto.Message { return &routev3.Route{} },
	"ROUTE_CONFIGURATION": func() proto.Message {
		return &routev3.RouteConfiguration{}
	},
	"CLUSTER":        func() proto.Message { return &clusterv3.Cluster{} },
	"LISTENER":       func() proto.Message { return &listenerv3.Listener{} },
	"FILTER_CHAIN":   func() proto.Message { return &listenerv3.FilterChain{} },
	"NETWORK_FILTER": func() proto.Message { return &listenerv3.Filter{} },
}

// ValidateEnvoyFilters reads a multi-document Kubernetes YAML stream and
// validates the Envoy part of every EnvoyFilter in it: each patch value is
// decoded into the message its applyTo names with unknown fields rejected;
// an ADD/INSERT_* value (a whole object) is validated whole, a MERGE value
// (a partial object) field by field. Documents of other kinds are skipped.
// It returns the decoded patches.
func ValidateEnvoyFilters(stream []byte) ([]EnvoyFilterPatch, error) {
	var out []EnvoyFilterPatch
	var errs []error
	dec := yaml.NewDecoder(bytes.NewReader(stream))
	for doc := 0; ; doc++ {
		var node yaml.Node
		if err := dec.Decode(&node); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		var ef struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
			Spec struct {
				ConfigPatches []struct {
					ApplyTo string `yaml:"applyTo"`
					Patch   struct {
						Operation string    `yaml:"operation"`
						Value     yaml.Node `yaml:"value"`
					} `yaml:"patch"`
				} `yaml:"configPatches"`
			} `yaml:"spec"`
		}
		if err := node.Decode(&ef); err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if ef.Kind != "EnvoyFilter" {
			continue
		}
		for i, cp := range ef.Spec.ConfigPatches {
			where := fmt.Sprintf("EnvoyFilter %s: configPatches[%d] (%s %s)", ef.Metadata.Name, i, cp.ApplyTo, cp.Patch.Operation)
			newMsg, ok := patchTypes[cp.ApplyTo]
			if !ok {
				errs = append(errs, fmt.Errorf("%s: applyTo %q not supported by the validator", where, cp.ApplyTo))
				continue
			}
			y, err := yaml.Marshal(&cp.Patch.Value)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
				continue
			}
			m := newMsg()
			if err := UnmarshalYAML(y, m); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
				continue
			}
			if strings.EqualFold(cp.Patch.Operation, "MERGE") {
				err = validateFields(m)
			} else {
				err = Validate(m)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
			}
			out = append(out, EnvoyFilterPatch{Filter: ef.Metadata.Name, ApplyTo: cp.ApplyTo, Operation: cp.Patch.Operation, Value: m})
		}
	}
	return out, errors.Join(errs...)
}
