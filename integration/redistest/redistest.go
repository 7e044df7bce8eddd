// Package redistest starts real redis-server processes (single servers and
// Redis Clusters) on free 127.0.0.1 ports for tests. Every process belongs to
// the test that started it: it runs in the test's temporary directory, is
// killed by PID in t.Cleanup, and every wait has a deadline.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// missing is the failure message when redis-server or redis-cli is not
// installed; tests never skip for it.
const missing = "redis-server not found: run `apt-get install -y redis-server` (make test does this)"

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = 10 * time.Second

// Server is one redis-server process listening on 127.0.0.1:Port.
type Server struct {
	Addr string // "127.0.0.1:<Port>"
	Port int
	PID  int // the current process; changes on Restart

	bin  string
	args []string // full argument list, port included
	dir  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// StartServer starts a redis-server on a free 127.0.0.1 port with no
// persistence and its working directory in t.TempDir(), waits until it
// answers PING and registers a cleanup that kills it. Extra args are passed
// to redis-server after the defaults (e.g. "--requirepass", "secret"). It
// calls t.Fatal when redis-server is not installed or does not start.
func StartServer(t testing.TB, args ...string) *Server {
	t.Helper()
	return startServer(t, nil, args...)
}

// StartSentinel starts a Redis Sentinel (redis-server --sentinel) on a free
// 127.0.0.1 port that monitors master under masterName with a quorum of 1
// and a down-after of 1 second, waits until it answers PING and registers a
// cleanup that kills it. Its Addr is what go-redis's FailoverOptions (or
// redis.ParseFailoverURL) takes as a sentinel address.
func StartSentinel(t testing.TB, masterName string, master *Server) *Server {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	text := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 1000\n",
		masterName, master.Port, masterName)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatalf("redistest: write sentinel config: %v", err)
	}
	return startServer(t, []string{conf, "--sentinel"})
}

// startServer starts redis-server with leading arguments (a config file
// must come first), the defaults, then args.
// StartServerOn is StartServer on a given port (a test that points rls at
// a port before Redis listens there).
func StartServerOn(t testing.TB, port int, args ...string) *Server {
	t.Helper()
	return startServerOn(t, port, nil, args...)
}

func startServer(t testing.TB, leading []string, args ...string) *Server {
	t.Helper()
	return startServerOn(t, 0, leading, args...)
}

// startServerOn starts a server on port, or on a free port when it is 0.
func startServerOn(t testing.TB, fixed int, leading []string, args ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(missing)
	}
	dir := t.TempDir()
	// A cluster node also listens on port+10000 (its bus), which must be a
	// valid port too.
	maxPort := 65535
	if slices.Contains(args, "--cluster-enabled") {
		maxPort -= 10000
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort(maxPort)
		if err != nil {
			t.Fatalf("redistest: pick a free port: %v", err)
		}
		if fixed != 0 {
			port = fixed
		}
		s := &Server{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			Port: port,
			bin:  bin,
			dir:  dir,
		}
		s.args = append(slices.Clone(leading),
			"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1",
			"--save", "",
			"--appendonly", "no",
			"--dir", dir,
			"--daemonize", "no",
			"--protected-mode", "no",
			"--loglevel", "warning",
		)
		s.args = append(s.args, args...)
		if lastErr = s.start(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: start redis-server: %v", lastErr)
	return nil
}

// freePort asks the kernel for a free TCP port on 127.0.0.1, at most max.
// Another process may take it before redis-server binds it; StartServer
// retries then.
func freePort(max int) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if port <= max {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free port at most %d in 100 tries", max)
}

// start runs the process and waits until it answers PING or exits.
func (s *Server) start() error {
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = ChildAttr()
	logPath := filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", s.Port))
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done, s.PID = cmd, done, cmd.Process.Pid
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited: %s", s.Port, tail(logPath))
		default:
		}
		if ping(s.Addr) == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.kill()
	return fmt.Errorf("redis-server on port %d did not answer PING within %v: %s", s.Port, startTimeout, tail(logPath))
}

// ping sends one PING on a fresh connection with a short deadline.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	// A server started with --requirepass answers NOAUTH: it is up.
	if !strings.HasPrefix(line, "+PONG") && !strings.HasPrefix(line, "-NOAUTH") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// tail returns the end of a log file for error messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// kill sends SIGKILL to the current process (and SIGCONT, in case it is
// paused) and waits for it to exit, at most 10 seconds.
func (s *Server) kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}

// Stop kills the server by PID (SIGKILL) and waits for it to exit. It is safe
// to call more than once and after the process has exited.
func (s *Server) Stop() { s.kill() }

// Pause stops the process with SIGSTOP: connections stay open but nothing is
// answered, like a hung server. Resume undoes it.
func (s *Server) Pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGSTOP)
	}
}

// Resume continues a paused process with SIGCONT.
func (s *Server) Resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// Restart kills the server and starts a fresh one with the same arguments on
// the same port (an empty dataset and script cache unless the arguments
// persist data). It calls t.Fatal if the port cannot be bound again within
// the start timeout.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.kill()
	deadline := time.Now().Add(startTimeout)
	var err error
	for time.Now().Before(deadline) {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("redistest: restart redis-server on port %d: %v", s.Port, err)
}

// Client returns a new client for the server that honours context deadlines
// and does not retry; the caller closes it.
func (s *Server) Client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
}

// URL returns the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr }

// CommandStats returns the number of calls per command from INFO
// commandstats, keyed by lower-case command name (e.g. "evalsha", "eval").
// It returns nil if the server cannot be asked.
func (s *Server) CommandStats(ctx context.Context) map[string]int64 {
	return s.commandStat(ctx, "calls")
}

// CommandUsec returns the server's own time per command (INFO
// commandstats' usec; a script's includes the commands it runs), keyed as
// CommandStats is; nil if the server cannot be asked.
func (s *Server) CommandUsec(ctx context.Context) map[string]int64 {
	return s.commandStat(ctx, "usec")
}

func (s *Server) commandStat(ctx context.Context, field string) map[string]int64 {
	c := s.Client()
	defer c.Close()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil
	}
	return parseCommandStats(info, field)
}

// parseCommandStats parses field (calls, usec) of lines like
// "cmdstat_evalsha:calls=3,usec=120,usec_per_call=40.00,...".
func parseCommandStats(info, field string) map[string]int64 {
	stats := make(map[string]int64)
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, field+"="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err == nil {
					stats[strings.ToLower(name)] = n
				}
			}
		}
	}
	return stats
}

// Cluster is a Redis Cluster of real redis-server processes.
type Cluster struct {
	Nodes []*Server // masters first, in creation order, then replicas
}

// StartCluster starts masters*(1+replicasPerMaster) cluster-enabled servers,
// joins them with redis-cli --cluster create and waits until every node
// reports cluster_state:ok with all 16384 slots assigned. Cleanup kills
// every node. It calls t.Fatal on any failure or after 30 seconds.
func StartCluster(t testing.TB, masters, replicasPerMaster int) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("redistest: a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal(missing)
	}
	n := masters * (1 + replicasPerMaster)
	c := &Cluster{}
	for i := 0; i < n; i++ {
		dir := t.TempDir()
		c.Nodes = append(c.Nodes, StartServer(t,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
		))
	}
	args := []string{"--cluster", "create"}
	for _, s := range c.Nodes {
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.waitReady(ctx, masters); err != nil {
		t.Fatalf("redistest: cluster not ready: %v", err)
	}
	return c
}

// waitReady polls every node until it reports cluster_state:ok, all slots
// assigned and the expected number of masters known, or ctx ends.
func (c *Cluster) waitReady(ctx context.Context, masters int) error {
	var lastErr error
	for {
		lastErr = c.checkReady(ctx, masters)
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) checkReady(ctx context.Context, masters int) error {
	for _, s := range c.Nodes {
		rc := s.Client()
		info, err := rc.ClusterInfo(ctx).Result()
		if err != nil {
			rc.Close()
			return fmt.Errorf("%s: %w", s.Addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_assigned:16384") ||
			!strings.Contains(info, "cluster_slots_ok:16384") {
			rc.Close()
			return fmt.Errorf("%s: not ok yet", s.Addr)
		}
		if !strings.Contains(info, fmt.Sprintf("cluster_size:%d", masters)) {
			rc.Close()
			return fmt.Errorf("%s: cluster_size is not %d yet", s.Addr, masters)
		}
		// Every node must know every other node, or clients see a partial view.
		nodes, err := rc.ClusterNodes(ctx).Result()
		rc.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", s.Addr, err)
		}
		if got := len(strings.Split(strings.TrimSpace(nodes), "\n")); got != len(c.Nodes) {
			return fmt.Errorf("%s knows %d of %d nodes", s.Addr, got, len(c.Nodes))
		}
	}
	return nil
}

// Seeds returns the cluster's addresses in go-redis's cluster URL form,
// "redis://h1:p1?addr=h2:p2&addr=h3:p3", for redis.ParseClusterURL.
func (c *Cluster) Seeds() string {
	var b strings.Builder
	b.WriteString("redis://")
	for i, s := range c.Nodes {
		switch i {
		case 0:
			b.WriteString(s.Addr)
		case 1:
			b.WriteString("?addr=" + s.Addr)
		default:
			b.WriteString("&addr=" + s.Addr)
		}
	}
	return b.String()
}

// Client returns a new cluster client seeded with every node; the caller
// closes it.
func (c *Cluster) Client() *redis.ClusterClient {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr
	}
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
}

// MasterOf returns the node that currently serves key's hash slot as a
// master, according to CLUSTER SLOTS on the first node that answers. It
// returns nil if no node can be asked or none matches.
func (c *Cluster) MasterOf(key string) *Server {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range c.Nodes {
		rc := s.Client()
		slot, err := rc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			rc.Close()
			continue
		}
		//lint:ignore SA1019 CLUSTER SLOTS works on every Redis the tests may find; CLUSTER SHARDS needs 7.0
		ranges, err := rc.ClusterSlots(ctx).Result()
		rc.Close()
		if err != nil {
			continue
		}
		for _, r := range ranges {
			if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
				for _, n := range c.Nodes {
					if n.Addr == r.Nodes[0].Addr {
						return n
					}
				}
			}
		}
	}
	return nil
}

// WaitReplicasSynced waits until every replica node reports
// master_link_status:up (its initial sync is done: only then can it be
// promoted when its master fails) and calls t.Fatal after within. Right
// after StartCluster a replica may still be waiting for its master's
// diskless sync (repl-diskless-sync-delay, 5 s by default).
func (c *Cluster) WaitReplicasSynced(t testing.TB, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		pending := ""
		for _, s := range c.Nodes {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			rc := s.Client()
			info, err := rc.Info(ctx, "replication").Result()
			rc.Close()
			cancel()
			if err != nil {
				pending = fmt.Sprintf("%s: %v", s.Addr, err)
				break
			}
			if strings.Contains(info, "role:slave") && !strings.Contains(info, "master_link_status:up") {
				pending = s.Addr + ": master_link_status not up"
				break
			}
		}
		if pending == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: replicas not in sync after %v: %s", within, pending)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
