package integration

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rls-project/rls/integration/redistest"
)

// peakRSS returns the peak resident set size of process pid in bytes
// (VmHWM, Linux), or 0 where /proc does not say.
func peakRSS(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// TestJSONBodiesBounded: run as ratelimit (upstream's /json on the HTTP
// port), 16 parallel 1 MiB bodies built to cost the most to decode (1 MiB
// of empty descriptors made 43 MB each) keep rls's peak RSS under 200 MB,
// each answered; and with the HTTP port at its cap, bodies sent byte by
// byte do not keep /healthcheck out.
func TestJSONBodiesBounded(t *testing.T) {
	light(t)
	srv := redistest.StartServer(t)
	env := []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + srv.Addr, "USE_STATSD=false"}
	p := startRLSBinEnv(t, rlsFastBin, env, "../config", "--env-compat", "upstream", "--max-conns", "20")
	p.waitServing(t, 20*time.Second)
	url := "http://" + p.HTTPAddr

	var empties bytes.Buffer
	empties.WriteString(`{"domain":"example","descriptors":[{}`)
	for empties.Len() < 1<<20-100 {
		empties.WriteString(`,{}`)
	}
	empties.WriteString(`]}`)
	var wg sync.WaitGroup
	codes := make([]int, 16)
	for i := range codes {
		wg.Go(func() {
			resp, err := http.Post(url+"/json", "application/json", bytes.NewReader(empties.Bytes()))
			if err != nil {
				t.Errorf("body %d: %v", i, err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusBadRequest && c != http.StatusServiceUnavailable {
			t.Errorf("body %d of 1 MiB of empty descriptors: %d, want 400 (over the bounds) or 503 (too many at once)", i, c)
		}
	}
	rss := peakRSS(t, p.cmd.Process.Pid)
	t.Logf("peak RSS after 16 parallel 1 MiB /json bodies: %.1f MB (answers %v)", float64(rss)/1e6, codes)
	if rss > 200<<20 {
		t.Errorf("peak RSS %d MB, over 200 MB", rss>>20)
	}

	// 40 bodies sent a byte every 20 ms on a port of 20 connections, and
	// /healthcheck on new connections each time.
	http.DefaultClient.CloseIdleConnections()
	stop := make(chan struct{})
	var slow sync.WaitGroup
	for range 40 {
		c, err := net.DialTimeout("tcp", p.HTTPAddr, time.Second)
		if err != nil {
			continue
		}
		if _, err := io.WriteString(c, "POST /json HTTP/1.1\r\nHost: rls\r\nContent-Length: 100000\r\n\r\n{"); err != nil {
			c.Close()
			continue
		}
		slow.Go(func() {
			defer c.Close()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if _, err := c.Write([]byte("{")); err != nil {
						return
					}
				}
			}
		})
	}
	defer func() { close(stop); slow.Wait() }()
	time.Sleep(200 * time.Millisecond) // the slow bodies hold the port for a while: real time on purpose
	failed := 0
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for range 20 {
		resp, err := client.Get(url + "/healthcheck")
		if err != nil || resp.StatusCode != http.StatusOK {
			failed++
		}
		if err == nil {
			resp.Body.Close()
		}
		time.Sleep(25 * time.Millisecond) // spaced checks: real time on purpose
	}
	if failed > 0 {
		t.Errorf("/healthcheck failed %d of 20 times while 40 bodies were sent byte by byte", failed)
	}
}
