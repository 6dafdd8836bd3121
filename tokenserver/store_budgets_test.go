package tokenserver

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// budgetGroup has a budget for every period and every kind of trigger.
func budgetGroup(name string) resourcegroup.Group {
	return resourcegroup.Group{Name: name, RUPerSec: 500, Budgets: []resourcegroup.Budget{
		{Period: resourcegroup.PeriodHour, RU: 1, Triggers: []resourcegroup.BudgetTrigger{{Percent: 100, Action: resourcegroup.BudgetNotify}}},
		{Period: resourcegroup.PeriodDay, RU: 2_000_000, Triggers: []resourcegroup.BudgetTrigger{
			{Percent: 80, Action: resourcegroup.BudgetNotify},
			{Percent: 100, Action: resourcegroup.BudgetThrottle, ThrottleRUPerSec: 50},
			{Percent: 1000, Action: resourcegroup.BudgetRefuse}}},
		{Period: resourcegroup.PeriodWeek, RU: resourcegroup.MaxRU, Triggers: []resourcegroup.BudgetTrigger{{Percent: 1, Action: resourcegroup.BudgetRefuse}}},
		{Period: resourcegroup.PeriodMonth, RU: 50_000_000, Triggers: []resourcegroup.BudgetTrigger{{Percent: 100, Action: resourcegroup.BudgetRefuse}}},
	}}
}

// A group's budgets are kept in its etcd record, by name, and come back
// whole; a record without them (every earlier version's) reads as none.
func TestGroupRecordBudgets(t *testing.T) {
	g := budgetGroup("b")
	data, err := encodeGroup(g)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `{"ru":2000000,"period":"DAY","triggers":[{"percent":80,"action":"NOTIFY"},{"percent":100,"action":"THROTTLE","throttle_ru_per_sec":50}`) {
		t.Errorf("record: %s", data)
	}
	back, err := decodeGroup("b", data, 0)
	if err != nil || !reflect.DeepEqual(back, g) {
		t.Errorf("round trip: %+v, %v\n want %+v", back, err, g)
	}
	plain, err := decodeGroup("p", []byte(`{"ru_per_sec":5,"priority":0,"burst":0}`), 0)
	if err != nil || plain.Budgets != nil {
		t.Errorf("a record of an earlier version: %+v, %v", plain.Budgets, err)
	}
	if data, _ := encodeGroup(resourcegroup.Group{Name: "p", RUPerSec: 5}); strings.Contains(string(data), "budgets") {
		t.Errorf("a group without budgets: %s", data)
	}
	// A name this version does not know loads (rules apply on write) and
	// fails validation.
	var r groupRecord
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	r.Budgets = []budgetRecord{{RU: 5, Period: "FORTNIGHT", Triggers: []triggerRecord{{Percent: 100, Action: "NOTIFY"}}}}
	odd, _ := json.Marshal(r)
	og, err := decodeGroup("o", odd, 0)
	if err != nil || len(og.Budgets) != 1 || og.Budgets[0].Period != 0 || og.Validate() == nil {
		t.Errorf("unknown period: %+v, %v", og.Budgets, err)
	}
}

// Budgets survive in etcd: create, read back, alter, list; the store
// refuses invalid ones.
func TestEtcdStoreBudgets(t *testing.T) {
	cli := startEtcd(t)
	st := NewEtcdStore(cli)
	ctx := context.Background()
	g := budgetGroup("b")
	if err := st.CreateGroup(ctx, g); err != nil {
		t.Fatal(err)
	}
	got, err := st.GetGroup(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	got.Version = 0
	if !reflect.DeepEqual(got, g) {
		t.Fatalf("read back %+v\n want %+v", got, g)
	}
	got.Budgets = got.Budgets[1:2]
	if err := st.AlterGroup(ctx, got); err != nil {
		t.Fatal(err)
	}
	list, err := st.ListGroups(ctx)
	if err != nil || len(list) == 0 || list[0].Name != "b" || resourcegroup.BudgetsSQL(list[0].Budgets) != "BUDGET=(RU=2000000 PER DAY, ON 80 PERCENT NOTIFY, ON 100 PERCENT THROTTLE(RU_PER_SEC=50), ON 1000 PERCENT REFUSE)" {
		t.Fatalf("after ALTER: %+v, %v", list, err)
	}
	bad := budgetGroup("b")
	bad.RUPerSec = 50 // the DAY budget's THROTTLE is 50
	if err := st.AlterGroup(ctx, bad); err == nil || !strings.Contains(err.Error(), "is not below the group's RU_PER_SEC = 50") {
		t.Errorf("ALTER to a rate the throttle is not below: %v", err)
	}
}

// rgserver validates budgets from a gRPC client as the parser does:
// InvalidArgument with the reason, nothing stored; valid ones come back
// from GetGroup as sent.
func TestRPCBudgetsValidated(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "s3cret")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer s3cret")
	rg := pb.NewResourceGroupServiceClient(ts.conn)
	ok := pb.GroupToPB(budgetGroup("b"))
	if _, err := rg.CreateGroup(admin, &pb.CreateGroupRequest{Group: ok}); err != nil {
		t.Fatal(err)
	}
	resp, err := rg.GetGroup(admin, &pb.GetGroupRequest{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if g := pb.GroupFromPB(resp.GetGroup()); !reflect.DeepEqual(g.Budgets, budgetGroup("b").Budgets) {
		t.Errorf("GetGroup's budgets: %+v", g.Budgets)
	}
	hostile := []struct {
		name    string
		budgets []*pb.Budget
		msg     string
	}{
		{"unknown period", []*pb.Budget{{Ru: 5, Period: "YEAR", Triggers: []*pb.BudgetTrigger{{Percent: 100, Action: "NOTIFY"}}}}, "unknown period"},
		{"unknown action", []*pb.Budget{{Ru: 5, Period: "DAY", Triggers: []*pb.BudgetTrigger{{Percent: 100, Action: "DELETE"}}}}, "unknown action"},
		{"no trigger", []*pb.Budget{{Ru: 5, Period: "DAY"}}, "BUDGET PER DAY has no trigger"},
		{"zero RU", []*pb.Budget{{Ru: 0, Period: "DAY", Triggers: []*pb.BudgetTrigger{{Percent: 100, Action: "NOTIFY"}}}}, "RU = 0 is out of range"},
		{"huge percent", []*pb.Budget{{Ru: 5, Period: "DAY", Triggers: []*pb.BudgetTrigger{{Percent: 1 << 31, Action: "NOTIFY"}}}}, "PERCENT is out of range"},
		{"throttle at the rate", []*pb.Budget{{Ru: 5, Period: "DAY", Triggers: []*pb.BudgetTrigger{{Percent: 100, Action: "THROTTLE", ThrottleRuPerSec: 500}}}}, "is not below the group's RU_PER_SEC = 500"},
		{"same period twice", []*pb.Budget{
			{Ru: 5, Period: "DAY", Triggers: []*pb.BudgetTrigger{{Percent: 100, Action: "NOTIFY"}}},
			{Ru: 6, Period: "DAY", Triggers: []*pb.BudgetTrigger{{Percent: 100, Action: "NOTIFY"}}}}, "BUDGET PER DAY is given twice"},
		{"five budgets", make([]*pb.Budget, 5), "5 budgets"},
	}
	for _, h := range hostile {
		g := &pb.ResourceGroup{Name: "h", RuPerSec: 500, Budgets: h.budgets}
		_, err := rg.CreateGroup(admin, &pb.CreateGroupRequest{Group: g})
		if codeOf(err) != codes.InvalidArgument || !strings.Contains(err.Error(), h.msg) {
			t.Errorf("create, %s: %v, want InvalidArgument ...%s...", h.name, err, h.msg)
		}
		g.Name = "b"
		_, err = rg.AlterGroup(admin, &pb.AlterGroupRequest{Group: g})
		if codeOf(err) != codes.InvalidArgument || !strings.Contains(err.Error(), h.msg) {
			t.Errorf("alter, %s: %v, want InvalidArgument ...%s...", h.name, err, h.msg)
		}
	}
	if _, err := rg.GetGroup(admin, &pb.GetGroupRequest{Name: "h"}); codeOf(err) != codes.NotFound {
		t.Errorf("a refused group was stored: %v", err)
	}
	if ts.srv.BudgetLocation() != time.UTC {
		t.Errorf("default budget time zone %v, want UTC", ts.srv.BudgetLocation())
	}
}
