//go:build redis

package global

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/integration/redistest"
)

// aclRules is docs/global.md's ACL of the global store's user.
const aclRules = "on >pw ~g:* resetchannels -@all +evalsha +script|load +time +hgetall +hset +hdel +pexpire +pexpireat +ping +hello"

// TestExchangeACL: the publish and the grant run under exactly docs/global.md's ACL
// (the script loaded on first use), and that page lists it.
func TestExchangeACL(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.Client()
	defer admin.Close()
	ctx := context.Background()
	if err := admin.Do(ctx, append([]any{"ACL", "SETUSER", "rlsg"}, toAny(strings.Fields(aclRules))...)...).Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "rlsg", Password: "pw"})
	defer c.Close()
	for i := range 2 {
		if err := Publish(ctx, c, settings("eu", "p1"), []Ask{{Key: "rl:{d:k=acl}:k", Limit: 10, Window: time.Second, Demand: 5}})[0]; err != nil {
			t.Errorf("publish %d: %v", i, err)
		}
		g := exchange1(t, c, settings("eu", "p1"), Ask{Key: "rl:{d:k=acl}:k", Limit: 10, Window: time.Second, Demand: 5})
		if len(g.Shares) == 0 || g.Shares[len(g.Shares)-1] != 10 {
			t.Errorf("exchange %d: %+v, want the whole limit alone", i, g)
		}
	}
	doc, err := readDoc()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(doc, "ACL SETUSER rls-global "+strings.Replace(aclRules, ">pw", ">PASSWORD", 1)) {
		t.Errorf("docs/global.md does not show the ACL %q", aclRules)
	}
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, x := range s {
		out[i] = x
	}
	return out
}
