package tokenpb

import (
	"reflect"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

func TestGroupRoundTrip(t *testing.T) {
	groups := []resourcegroup.Group{
		{Name: "default", RUPerSec: resourcegroup.Unlimited, Burst: resourcegroup.BurstUnlimited, Version: 3},
		{Name: "rg1", RUPerSec: 500, Priority: resourcegroup.PriorityHigh, Burst: resourcegroup.BurstModerated},
		{Name: "rg2", RUPerSec: 1, Priority: resourcegroup.PriorityLow, QueryLimit: &resourcegroup.QueryLimit{
			ExecElapsed: 1500 * time.Millisecond, Action: resourcegroup.ActionSwitchGroup, SwitchGroup: "rg1",
			Watch: resourcegroup.WatchSimilar, WatchDuration: 10 * time.Minute}},
		{Name: "rg3", RUPerSec: 10, QueryLimit: &resourcegroup.QueryLimit{RU: 1000, Action: resourcegroup.ActionKill}},
	}
	for _, g := range groups {
		if got := GroupFromPB(GroupToPB(g)); !reflect.DeepEqual(got, g) {
			t.Errorf("round trip of %+v gave %+v", g, got)
		}
	}
	b := resourcegroup.Binding{User: "app", Host: "%", Group: "rg1"}
	if got := BindingFromPB(BindingToPB(b)); got != b {
		t.Errorf("binding round trip gave %+v", got)
	}
	if g := GroupFromPB(nil); !reflect.DeepEqual(g, resourcegroup.Group{}) {
		t.Errorf("nil group gave %+v", g)
	}
}
