package service

import (
	"testing"

	"github.com/rls-project/rls/pkg/descriptors"
)

// TestVerdict: a request is over when a regular descriptor is, or when all
// of its quota descriptors are; its body is the first regular denial's,
// else the first quota denial's.
func TestVerdict(t *testing.T) {
	plain := &descriptors.Rule{Name: "plain"}
	regBody := &descriptors.Rule{Name: "reg", ResponseBody: "regular"}
	regBody2 := &descriptors.Rule{Name: "reg2", ResponseBody: "regular 2"}
	quotaBody := &descriptors.Rule{Name: "quota", ResponseBody: "quota"}
	type denial struct {
		r     *descriptors.Rule
		quota bool
	}
	for _, tc := range []struct {
		name     string
		quotas   int // quota descriptors, denied or not
		denials  []denial
		over     bool
		body     *descriptors.Rule
		outcomes []Outcome
	}{
		{"nothing denied", 0, nil, false, nil, nil},
		{"quotas but none over", 2, nil, false, nil, nil},
		{"regular denial", 0, []denial{{plain, false}}, true, nil, []Outcome{OutcomeOverLimit}},
		{"first regular body", 0, []denial{{plain, false}, {regBody, false}, {regBody2, false}}, true, regBody, []Outcome{OutcomeOverLimit, OutcomeOverLimit, OutcomeOverLimit}},
		{"one of two quotas over", 2, []denial{{quotaBody, true}}, false, quotaBody, []Outcome{OutcomeQuotaOverLimit}},
		{"every quota over", 2, []denial{{plain, true}, {quotaBody, true}}, true, quotaBody, []Outcome{OutcomeQuotaOverLimit, OutcomeQuotaOverLimit}},
		{"regular body before quota body", 1, []denial{{quotaBody, true}, {regBody, false}}, true, regBody, []Outcome{OutcomeQuotaOverLimit, OutcomeOverLimit}},
		{"quota body when the regular has none", 3, []denial{{quotaBody, true}, {plain, false}}, true, quotaBody, []Outcome{OutcomeQuotaOverLimit, OutcomeOverLimit}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := verdict{quotas: tc.quotas}
			for i, d := range tc.denials {
				if got := v.deny(d.r, d.quota); got != tc.outcomes[i] {
					t.Errorf("deny %d: outcome %v, want %v", i, got, tc.outcomes[i])
				}
			}
			if got := v.over(); got != tc.over {
				t.Errorf("over() = %v, want %v", got, tc.over)
			}
			if got := v.bodyRule(); got != tc.body {
				t.Errorf("bodyRule() = %v, want %v", got, tc.body)
			}
		})
	}
}
