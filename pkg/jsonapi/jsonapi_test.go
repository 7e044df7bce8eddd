package jsonapi

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
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

// TestJSONBounds: a body of more JSON objects than any request within the
// service's bounds has, or nested deeper, is refused before it is decoded;
// a body sent slower than ReadTimeout is 408; requests beyond MaxInFlight
// are 503 at once, and a slot frees when a request ends.
func TestJSONBounds(t *testing.T) {
	svc := service.New(&descriptors.Config{}, limiter.New(memory.New(memory.Options{}), limiter.Options{}), service.Options{})
	h := Handler(svc, Options{MaxInFlight: 2, ReadTimeout: 300 * time.Millisecond})
	srv := httptest.NewServer(h)
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
	empties := `{"domain":"d","descriptors":[` + strings.Repeat(`{},`, 5000) + `{}]}`
	if code, body := post(empties); code != 400 || !strings.Contains(body, "more than 4096 JSON objects") {
		t.Errorf("5,001 empty descriptors: %d %s, want 400 naming the bound", code, body)
	}
	if code, body := post(strings.Repeat("[", 20) + strings.Repeat("]", 20)); code != 400 || !strings.Contains(body, "nested more than 16") {
		t.Errorf("20 nested arrays: %d %s, want 400 naming the bound", code, body)
	}
	if code, body := post(`{"domain":"d","descriptors":[{"entries":[{"key":"{[{[","value":"]]}}\"{"}]}]}`); code != 200 {
		t.Errorf("brackets in strings: %d %s, want 200 (they are not counted)", code, body)
	}

	// Slow bodies: two hold the slots, the third is 503 at once; the two
	// are 408 after ReadTimeout, and their slots are free again.
	slow := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
		return c, bufio.NewReader(c)
	}
	status := func(r *bufio.Reader) int {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	_, r1 := slow()
	_, r2 := slow()
	if !testkit.Eventually(5*time.Second, func() bool { return len(h.(*handler).slots) == 2 }) {
		t.Fatal("the two slow bodies never held both slots")
	}
	_, r3 := slow()
	if code := status(r3); code != http.StatusServiceUnavailable {
		t.Errorf("a third body beside two in flight: %d, want 503", code)
	}
	for _, r := range []*bufio.Reader{r1, r2} {
		if code := status(r); code != http.StatusRequestTimeout {
			t.Errorf("a body not sent within ReadTimeout: %d, want 408", code)
		}
	}
	if code, _ := post(`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`); code != 200 {
		t.Errorf("a request after the slow ones: %d, want 200", code)
	}
}
