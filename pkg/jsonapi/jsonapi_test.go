package jsonapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/store/memory"
)

func TestJSON(t *testing.T) {
	cfg, err := descriptors.Parse(map[string][]byte{"rl.yaml": []byte("domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")})
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(cfg, limiter.New(memory.New(memory.Options{}), limiter.Options{}), service.Options{})
	srv := httptest.NewServer(Handler(svc, Options{MaxBytes: 4096}))
	defer srv.Close()
	post := func(body string) (int, string) {
		resp, err := http.Post(srv.URL, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	req := `{"domain":"rl","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`
	if code, body := post(req); code != 200 || !strings.Contains(body, `"overallCode":"OK"`) {
		t.Errorf("first: %d %s", code, body)
	}
	if code, body := post(req); code != 429 || !strings.Contains(body, `"overallCode":"OVER_LIMIT"`) {
		t.Errorf("second: %d %s, want 429 OVER_LIMIT", code, body)
	}
	if code, _ := post(`{"domain":`); code != 400 {
		t.Errorf("broken JSON: %d, want 400", code)
	}
	// The service's own bound: 64 descriptors a request.
	many := `{"domain":"rl","descriptors":[` + strings.Repeat(`{"entries":[{"key":"k","value":"v"}]},`, 64) + `{"entries":[{"key":"k","value":"v"}]}]}`
	if code, body := post(many); code != 400 || !strings.Contains(body, "descriptors") {
		t.Errorf("65 descriptors: %d %s, want 400 naming the bound", code, body)
	}
	if code, _ := post(`{"domain":"` + strings.Repeat("x", 5000) + `"}`); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over MaxBytes: %d, want 413", code)
	}
}
