package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestReadReply(t *testing.T) {
	in := "+OK\r\n-ERR no\r\n:42\r\n$5\r\nhe\r\nl\r\n$-1\r\n*-1\r\n*2\r\n$1\r\n0\r\n*2\r\n$1\r\na\r\n:7\r\n"
	r := bufio.NewReader(strings.NewReader(in))
	want := []string{"OK", "ERR no", "42", "he\r\nl", "<nil>", "<nil>", "[0 [a 7]]"}
	for i, w := range want {
		v, err := readReply(r)
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if got := fmt.Sprint(v); got != w {
			t.Errorf("reply %d = %q, want %q", i, got, w)
		}
	}
	if v, _ := readReply(bufio.NewReader(strings.NewReader("-ERR x\r\n"))); v != respError("ERR x") {
		t.Errorf("error reply: %#v", v)
	}
	for _, bad := range []string{"", "\r\n", "?x\r\n", ":x\r\n", "$x\r\n", "$-2\r\n", "$5\r\nab\r\n", "*x\r\n", "*1\r\n",
		strings.Repeat("*1\r\n", 20) + ":1\r\n"} {
		if _, err := readReply(bufio.NewReader(strings.NewReader(bad))); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

// fakeRedis answers INFO, DBSIZE, SCAN (10 keys a page) and MEMORY USAGE
// over a set of keys; key "gone" expires between SCAN and MEMORY USAGE.
type fakeRedis struct {
	mu   sync.Mutex
	keys []string
	info string
	cmds []string
}

func startFakeRedis(t *testing.T, f *fakeRedis) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go f.serve(c)
		}
	}()
	return lis.Addr().String()
}

func (f *fakeRedis) serve(c net.Conn) {
	defer c.Close()
	r, w := bufio.NewReader(c), bufio.NewWriter(c)
	for {
		v, err := readReply(r)
		if err != nil {
			return
		}
		a, _ := v.([]any)
		args := make([]string, len(a))
		for i := range a {
			args[i], _ = a[i].(string)
		}
		f.mu.Lock()
		f.cmds = append(f.cmds, strings.Join(args, " "))
		f.mu.Unlock()
		switch strings.ToUpper(args[0]) {
		case "INFO":
			fmt.Fprintf(w, "$%d\r\n%s\r\n", len(f.info), f.info)
		case "DBSIZE":
			fmt.Fprintf(w, ":%d\r\n", len(f.keys))
		case "SCAN":
			cur, _ := strconv.Atoi(args[1])
			end := min(cur+10, len(f.keys))
			next := end
			if end == len(f.keys) {
				next = 0
			}
			fmt.Fprintf(w, "*2\r\n$%d\r\n%d\r\n*%d\r\n", len(strconv.Itoa(next)), next, end-cur)
			for _, k := range f.keys[cur:end] {
				fmt.Fprintf(w, "$%d\r\n%s\r\n", len(k), k)
			}
		case "MEMORY":
			if args[2] == "gone" {
				w.WriteString("$-1\r\n")
			} else {
				fmt.Fprintf(w, ":%d\r\n", 50+len(args[2]))
			}
		default:
			w.WriteString("-ERR unknown command\r\n")
		}
		w.Flush()
	}
}

func TestSampleKeys(t *testing.T) {
	f := &fakeRedis{}
	for i := range 25 {
		f.keys = append(f.keys, fmt.Sprintf("k%02d", i)) // MEMORY USAGE 53 each
	}
	f.keys[3] = "gone"
	addr := startFakeRedis(t, f)
	k, err := sampleKeys(context.Background(), addr, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if k.DBSize != 25 || k.Sampled != 24 || k.MeanBytes != 53 {
		t.Fatalf("%+v", k)
	}
	// n bounds the sample, and SCAN stops once it has n keys.
	if k, err = sampleKeys(context.Background(), addr, 12); err != nil || k.Sampled != 11 {
		t.Fatalf("%+v %v", k, err)
	}
	scans := 0
	for _, c := range f.cmds {
		if strings.HasPrefix(c, "SCAN") {
			scans++
		}
	}
	if scans != 3+2 {
		t.Fatalf("SCAN calls %d: %v", scans, f.cmds)
	}
	if !strings.Contains(strings.Join(f.cmds, "|"), "MEMORY USAGE k00 SAMPLES 0") {
		t.Fatalf("%v", f.cmds)
	}
}

func TestRunKeySample(t *testing.T) {
	addr, _ := startFake(t)
	f := &fakeRedis{keys: []string{"a", "bb"}, info: sampleInfo}
	raddr := startFakeRedis(t, f)
	r, _ := runJSON(t, "-addr", addr, "-domain", "bench", "-n", "100", "-warmup", "0", "-redis-addr", raddr, "-redis-key-sample", "10")
	if r.Host == nil || r.Host.BusyCores < 0 {
		t.Errorf("host cpu: %+v", r.Host)
	}
	k := r.Redis.Keys
	if k == nil || k.DBSize != 2 || k.Sampled != 2 || k.MeanBytes != 51.5 || k.UsedMemoryFrom != 1038480 || k.UsedMemoryTo != 1038480 || k.UsedMemoryPerKey != 0 {
		t.Fatalf("%+v", k)
	}
	var out, errw strings.Builder
	if err := run(context.Background(), []string{"-addr", addr, "-n", "1", "-redis-key-sample", "5"}, &out, &errw); err == nil ||
		!strings.Contains(err.Error(), "needs -redis-addr") {
		t.Fatalf("want a refusal, got %v", err)
	}
}
