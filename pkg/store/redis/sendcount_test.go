package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/lua"
)

// sendCounter is a go-redis hook that counts what a store sends to Redis,
// seen from the clients that talk to the nodes (the store keeps no counters
// of its own): script calls (EVALSHA, EVAL) sent alone, pipelines of script
// calls and their sizes, requests per script call (the coalescer merges
// concurrent requests into one call), script calls sent as EVAL (re-sent
// after NOSCRIPT), and script calls a node answered with MOVED or ASK.
type sendCounter struct {
	mu sync.Mutex
	st sendStats
}

// sendStats are a sendCounter's counts.
type sendStats struct {
	Alone     int64 // script calls sent alone
	Pipelines int64 // pipelines holding script calls
	Calls     int64 // script calls, alone or in pipelines
	MaxBatch  int64 // most script calls in one pipeline
	Merged    int64 // script calls deciding two requests or more
	Requests  int64 // requests decided by script calls
	MaxMerged int64 // most requests in one script call
	NoScript  int64 // EVAL calls alone, and pipelines that begin with EVAL
	Redirects int64 // script calls answered with MOVED or ASK
}

// requests counts the requests a script call decides: its ARGV values
// after the header, one per request.
func requests(cmd redis.Cmder) int64 {
	args := cmd.Args() // evalsha sha (fcall function) numkeys keys... argv...
	nk, _ := strconv.Atoi(fmt.Sprint(args[2]))
	return int64(len(args) - 3 - nk - lua.HeaderArgs)
}

// count adds one script call's requests.
func (s *sendStats) count(cmd redis.Cmder) {
	n := requests(cmd)
	s.Requests += n
	if n > 1 {
		s.Merged++
	}
	s.MaxMerged = max(s.MaxMerged, n)
}

// Sends is the number of round trips that carried script calls.
func (s sendStats) Sends() int64 { return s.Alone + s.Pipelines }

func (h *sendCounter) stats() sendStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st
}

func isScript(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "evalsha", "eval", "fcall", "fcall_ro":
		return true
	}
	return false
}

func isRedirect(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "MOVED ") || redis.HasErrorPrefix(err, "ASK "))
}

func (h *sendCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *sendCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if isScript(cmd) {
			h.mu.Lock()
			h.st.Alone++
			h.st.Calls++
			h.st.count(cmd)
			if cmd.Name() == "eval" {
				h.st.NoScript++
			}
			if isRedirect(cmd.Err()) {
				h.st.Redirects++
			}
			h.mu.Unlock()
		}
		return err
	}
}

func (h *sendCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		var n, redirects int64
		first := ""
		var counts sendStats
		for _, c := range cmds {
			if isScript(c) {
				counts.count(c)
				if n == 0 {
					first = c.Name()
				}
				n++
				if isRedirect(c.Err()) {
					redirects++
				}
			}
		}
		if n > 0 {
			h.mu.Lock()
			h.st.Pipelines++
			h.st.Calls += n
			h.st.MaxBatch = max(h.st.MaxBatch, n)
			if first == "eval" {
				h.st.NoScript++
			}
			h.st.Redirects += redirects
			h.st.Requests += counts.Requests
			h.st.Merged += counts.Merged
			h.st.MaxMerged = max(h.st.MaxMerged, counts.MaxMerged)
			h.mu.Unlock()
		}
		return err
	}
}

// counted returns a client for addr that honours context deadlines, does
// not retry, and reports to a new sendCounter.
func counted(addr string) (*redis.Client, *sendCounter) {
	h := &sendCounter{}
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	c.AddHook(h)
	return c, h
}

// countedCluster returns a cluster client seeded with addrs whose node
// clients all report to a new sendCounter.
func countedCluster(addrs []string) (*redis.ClusterClient, *sendCounter) {
	h := &sendCounter{}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true,
		NewClient: func(o *redis.Options) *redis.Client {
			nc := redis.NewClient(o)
			nc.AddHook(h)
			return nc
		}})
	return c, h
}
