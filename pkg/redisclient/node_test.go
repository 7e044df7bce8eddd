package redisclient

import "testing"

func TestNode(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{URL: "redis://:secret@h:6379/0"}, "h:6379"},
		{Options{URL: "unix:///run/redis.sock"}, "/run/redis.sock"},
		{Options{URL: "redis://s1:26379?master_name=m", Mode: ModeSentinel}, "master m"},
		{Options{URL: "redis://s1:26379?master_name=m", Mode: ModeSentinel, MasterName: "n"}, "master n"},
		{Options{URL: "://"}, "unknown"},
	} {
		if got := Node(tc.o); got != tc.want {
			t.Errorf("Node(%+v) = %q, want %q", tc.o, got, tc.want)
		}
	}
}
