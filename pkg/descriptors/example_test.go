package descriptors_test

import (
	"fmt"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
)

func ExampleConfig_Match() {
	cfg, err := descriptors.Parse(map[string][]byte{"api.yaml": []byte(`
domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: route
        value: /v1/*
        rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	request := []*rlcommon.RateLimitDescriptor_Entry{
		{Key: "api_key", Value: "alice"},
		{Key: "route", Value: "/v1/users"},
	}
	r := cfg.Match("api", request)
	fmt.Println(r.Path, r.RequestsPerUnit, "per", r.Unit, r.Algorithm, "burst", r.Burst)
	fmt.Println(string(descriptors.AppendKey(nil, "api", request, r)))
	fmt.Println(cfg.Match("api", request[:1]).RequestsPerUnit, "per", cfg.Match("api", request[:1]).Window())
	fmt.Println(cfg.Match("web", request) == nil)
	// Output:
	// api_key/route=/v1/* 10 per second token_bucket burst 20
	// tb:{api|api_key=alice}:t1|route=/v1/users
	// 100 per 1m0s
	// true
}

func ExampleLoad_errors() {
	_, _, err := descriptors.Load("testdata/invalid/many_errors")
	fmt.Println(err)
	// Output:
	// testdata/invalid/many_errors/a.yaml:5: unit: invalid unit "fortnight"; choices are second, minute, hour, day, week, month, year
	// testdata/invalid/many_errors/a.yaml:6: requests_per_unit: must not be negative, got -3
	// testdata/invalid/many_errors/a.yaml:7: key: must not be empty
	// testdata/invalid/many_errors/b.yaml:2: typo: unknown field; allowed: domain, descriptors
	// testdata/invalid/many_errors/b.yaml:7: unit: must not be set when unlimited is true
}
