package connguard

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rls-project/rls/pkg/testkit"
)

// TestLimit: beyond the cap a connection is accepted and closed at once
// (counted, and logged once however many); closing one of those held frees
// its slot, once however often it is closed.
func TestLimit(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(prometheus.NewRegistry())
	var logs testkit.Buffer
	l := Limit(raw, LimitOptions{Port: "grpc-addr", Max: 2, Metrics: m, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// closedWithin reports whether the server closed c (a read sees EOF)
	// within d.
	closedWithin := func(c net.Conn, d time.Duration) bool {
		c.SetReadDeadline(time.Now().Add(d))
		_, err := c.Read(make([]byte, 1))
		return errors.Is(err, io.EOF)
	}
	dial()
	dial()
	held := []net.Conn{<-accepted, <-accepted}
	for range 3 {
		if c := dial(); !closedWithin(c, 10*time.Second) {
			t.Fatal("a connection beyond the cap was not closed")
		}
	}
	if got := testutil.ToFloat64(m.refused.WithLabelValues("grpc-addr")); got != 3 {
		t.Errorf("refused = %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("grpc-addr")); got != 2 {
		t.Errorf("open = %v, want 2", got)
	}
	if n := strings.Count(logs.String(), "connection limit reached"); n != 1 {
		t.Errorf("%d warnings for 3 refused connections, want 1:\n%s", n, logs.String())
	}
	held[0].Close()
	held[0].Close() // twice frees once
	if fourth := dial(); closedWithin(fourth, 300*time.Millisecond) {
		t.Fatal("a connection within the cap (after one closed) was closed")
	}
	<-accepted
	if got := testutil.ToFloat64(m.open.WithLabelValues("grpc-addr")); got != 2 {
		t.Errorf("open = %v, want 2", got)
	}
}

// TestLimitNoCap: Max 0 caps nothing and still counts.
func TestLimitNoCap(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(prometheus.NewRegistry())
	l := Limit(raw, LimitOptions{Port: "http-addr", Metrics: m})
	defer l.Close()
	for range 5 {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := l.Accept(); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("http-addr")); got != 5 {
		t.Errorf("open = %v, want 5", got)
	}
}
