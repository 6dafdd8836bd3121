package resourcegroup

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/sqltext"
)

func TestParse(t *testing.T) {
	ql := func(q QueryLimit) *QueryLimit { return &q }
	tests := []struct {
		sql  string
		want Statement
	}{
		{"CREATE RESOURCE GROUP rg1 RU_PER_SEC = 500",
			&CreateGroup{Group: Group{Name: "rg1", RUPerSec: 500}}},
		{"create resource group if not exists `RG1` ru_per_sec=500, priority=low, burstable;",
			&CreateGroup{IfNotExists: true, Group: Group{Name: "rg1", RUPerSec: 500, Priority: PriorityLow, Burst: BurstModerated}}},
		{"CREATE RESOURCE GROUP rg1 RU_PER_SEC = 500 PRIORITY = HIGH BURSTABLE = UNLIMITED",
			&CreateGroup{Group: Group{Name: "rg1", RUPerSec: 500, Priority: PriorityHigh, Burst: BurstUnlimited}}},
		{"CREATE RESOURCE GROUP rg1 BURSTABLE=OFF RU_PER_SEC UNLIMITED PRIORITY MEDIUM",
			&CreateGroup{Group: Group{Name: "rg1", RUPerSec: Unlimited}}},
		{"CREATE RESOURCE GROUP rg1 RU_PER_SEC=1 BURSTABLE=TRUE", &CreateGroup{Group: Group{Name: "rg1", RUPerSec: 1, Burst: BurstModerated}}},
		{"CREATE RESOURCE GROUP rg1 RU_PER_SEC=1 BURSTABLE=false", &CreateGroup{Group: Group{Name: "rg1", RUPerSec: 1}}},
		{"CREATE RESOURCE GROUP rg1 RU_PER_SEC=1 BURSTABLE=moderated", &CreateGroup{Group: Group{Name: "rg1", RUPerSec: 1, Burst: BurstModerated}}},
		{"CREATE RESOURCE GROUP rg1 RU_PER_SEC = 500 QUERY_LIMIT = (EXEC_ELAPSED = '60s', ACTION = SWITCH_GROUP(Rg2), WATCH = SIMILAR DURATION = '10m')",
			&CreateGroup{Group: Group{Name: "rg1", RUPerSec: 500, QueryLimit: ql(QueryLimit{ExecElapsed: time.Minute, Action: ActionSwitchGroup, SwitchGroup: "rg2", Watch: WatchSimilar, WatchDuration: 10 * time.Minute})}}},
		{"create resource group y BURSTABLE RU_PER_SEC=2000 QUERY_LIMIT=(EXEC_ELAPSED='1s' action COOLDOWN WATCH EXACT duration '1h')",
			&CreateGroup{Group: Group{Name: "y", RUPerSec: 2000, Burst: BurstModerated, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: ActionCooldown, Watch: WatchExact, WatchDuration: time.Hour})}}},
		{`CREATE RESOURCE GROUP x RU_PER_SEC=1 QUERY_LIMIT=(RU=1000 ACTION=DRYRUN WATCH=EXACT DURATION=UNLIMITED)`,
			&CreateGroup{Group: Group{Name: "x", RUPerSec: 1, QueryLimit: ql(QueryLimit{RU: 1000, Action: ActionDryRun, Watch: WatchExact})}}},
		{`CREATE RESOURCE GROUP x RU_PER_SEC=1 QUERY_LIMIT=(EXEC_ELAPSED="1.5s" ACTION=KILL)`,
			&CreateGroup{Group: Group{Name: "x", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: 1500 * time.Millisecond, Action: ActionKill})}}},
		{"CREATE RESOURCE GROUP x RU_PER_SEC=1 QUERY_LIMIT=NULL", &CreateGroup{Group: Group{Name: "x", RUPerSec: 1}}},
		{"/* c */ -- line\n# hash\n  CREATE /*+ x */ RESOURCE GROUP x RU_PER_SEC=1 --", &CreateGroup{Group: Group{Name: "x", RUPerSec: 1}}},
		{"ALTER RESOURCE GROUP rg1 RU_PER_SEC = 800",
			&AlterGroup{Name: "rg1", Fields: FieldRUPerSec, Options: Group{Name: "rg1", RUPerSec: 800}}},
		{"alter resource group if exists `default` priority=low burstable=off query_limit=null",
			&AlterGroup{IfExists: true, Name: "default", Fields: FieldPriority | FieldBurst | FieldQueryLimit, Options: Group{Name: "default", Priority: PriorityLow}}},
		{"ALTER RESOURCE GROUP rg1 QUERY_LIMIT=()",
			&AlterGroup{Name: "rg1", Fields: FieldQueryLimit, Options: Group{Name: "rg1"}}},
		{"ALTER RESOURCE GROUP rg1 QUERY_LIMIT=(EXEC_ELAPSED='20s' ACTION DRYRUN WATCH SIMILAR)",
			&AlterGroup{Name: "rg1", Fields: FieldQueryLimit, Options: Group{Name: "rg1", QueryLimit: ql(QueryLimit{ExecElapsed: 20 * time.Second, Action: ActionDryRun, Watch: WatchSimilar})}}},
		{"DROP RESOURCE GROUP rg1", &DropGroup{Name: "rg1"}},
		{"drop resource group if exists RG1;", &DropGroup{IfExists: true, Name: "rg1"}},
		{"ALTER USER 'app'@'%' RESOURCE GROUP rg1", &AlterUserGroup{User: "app", Host: "%", Group: "rg1"}},
		{"ALTER USER app RESOURCE GROUP `RG1`", &AlterUserGroup{User: "app", Host: "%", Group: "rg1"}},
		{"alter user if exists `a b`@10.0.0.1 resource group default", &AlterUserGroup{IfExists: true, User: "a b", Host: "10.0.0.1", Group: "default"}},
		{`ALTER USER "app"@localhost RESOURCE GROUP ` + "``", &AlterUserGroup{User: "app", Host: "localhost", Group: "default"}},
		{"CREATE RESOURCE GROUP BINDING FOR TAG route = '/report' TO RG_Reports",
			&CreateTagBinding{Key: "route", Value: "/report", Group: "rg_reports"}},
		{"create resource group binding for tag 'db.driver' = \"go\" to `rg1`;",
			&CreateTagBinding{Key: "db.driver", Value: "go", Group: "rg1"}},
		{"CREATE RESOURCE GROUP BINDING FOR TAG `Route` = '' TO rg1", &CreateTagBinding{Key: "Route", Group: "rg1"}},
		// A group named binding is still a group.
		{"CREATE RESOURCE GROUP binding RU_PER_SEC = 1", &CreateGroup{Group: Group{Name: "binding", RUPerSec: 1}}},
		{"CREATE RESOURCE GROUP IF NOT EXISTS binding RU_PER_SEC = 1", &CreateGroup{IfNotExists: true, Group: Group{Name: "binding", RUPerSec: 1}}},
		{"CREATE RESOURCE GROUP `binding` RU_PER_SEC = 1", &CreateGroup{Group: Group{Name: "binding", RUPerSec: 1}}},
		{"DROP RESOURCE GROUP BINDING FOR TAG route = '/report'", &DropTagBinding{Key: "route", Value: "/report"}},
		{"CREATE RESOURCE GROUP BINDING FOR DIGEST '00ab34CD56ef7890' TO RG_Night",
			&CreateDigestBinding{Digest: "00ab34cd56ef7890", Group: "rg_night"}},
		{"create resource group binding for digest \"ffffffffffffffff\" to `rg1`;",
			&CreateDigestBinding{Digest: "ffffffffffffffff", Group: "rg1"}},
		{"DROP RESOURCE GROUP BINDING FOR DIGEST '00ab34cd56ef7890'", &DropDigestBinding{Digest: "00ab34cd56ef7890"}},
		{"CREATE GLOBAL BINDING FOR SELECT * FROM t USING SELECT /*+ RESOURCE_GROUP(rg) */ * FROM t",
			&StmtBinding{Create: true, HasFor: true, Text: "SELECT * FROM t USING SELECT /*+ RESOURCE_GROUP(rg) */ * FROM t", Usings: [][2]int{{16, 21}}}},
		{"create binding for select a from t join u using (id) using select a from t join u using (id);",
			&StmtBinding{Create: true, HasFor: true, Text: "select a from t join u using (id) using select a from t join u using (id)",
				Usings: [][2]int{{23, 28}, {34, 39}, {63, 68}}}},
		{"CREATE BINDING USING SELECT /*+ RESOURCE_GROUP(rg) */ 'using' FROM `using`",
			&StmtBinding{Create: true, Text: "USING SELECT /*+ RESOURCE_GROUP(rg) */ 'using' FROM `using`", Usings: [][2]int{{0, 5}}}},
		{"DROP GLOBAL BINDING FOR SELECT 1", &StmtBinding{HasFor: true, Text: "SELECT 1"}},
		{"drop binding for sql digest '00AB34CD56EF7890'", &DropDigestBinding{Digest: "00ab34cd56ef7890"}},
		{"drop resource group binding if exists for digest '00AB34CD56EF7890';",
			&DropDigestBinding{IfExists: true, Digest: "00ab34cd56ef7890"}},
		{"drop resource group binding if exists for tag route='/report';", &DropTagBinding{IfExists: true, Key: "route", Value: "/report"}},
		{"DROP RESOURCE GROUP binding", &DropGroup{Name: "binding"}},
		{"DROP RESOURCE GROUP IF EXISTS binding", &DropGroup{IfExists: true, Name: "binding"}},
		{"SET RESOURCE GROUP Rg1", &SetGroup{Name: "rg1"}},
		{"set resource group `default`;", &SetGroup{Name: "default"}},
		{"SELECT CURRENT_RESOURCE_GROUP()", &CurrentGroup{}},
		{"select current_resource_group ( ) ;", &CurrentGroup{}},
		{"SHOW CREATE RESOURCE GROUP rg1", &ShowCreateGroup{Name: "rg1"}},
		{"SHOW RESOURCE GROUP USAGE", &ShowUsage{}},
		{"SHOW CLUSTER RESOURCE GROUP USAGE", &ShowUsage{Cluster: true}},
		{"show cluster resource group usage like 'rg%';", &ShowUsage{Filter: "like 'rg%'", Cluster: true}},
		{"show last statement ru;", &ShowLastStatementRU{}},
		{"SELECT * FROM information_schema.resource_groups", &SelectGroups{Columns: InfoSchemaColumns()}},
		{"SELECT * FROM INFORMATION_SCHEMA.RESOURCE_GROUPS WHERE NAME = 'RG1';", &SelectGroups{Columns: InfoSchemaColumns(), Name: "rg1", HasWhere: true}},
		{"select name, `ru_per_sec`, query_limit from `information_schema`.`resource_groups` where `name`=\"x\"",
			&SelectGroups{Columns: []string{"NAME", "RU_PER_SEC", "QUERY_LIMIT"}, Name: "x", HasWhere: true}},
	}
	for _, tt := range tests {
		t.Run(tt.sql, func(t *testing.T) {
			got, err := Parse(tt.sql, sqltext.Mode{})
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %#v\nwant %#v", got, tt.want)
			}
			if !IsAdmin(tt.sql, sqltext.Mode{}) {
				t.Errorf("IsAdmin = false for a statement Parse accepts")
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		sql  string
		code uint16
		msg  string // substring of the message
	}{
		{"CREATE RESOURCE GROUP x", 1064, "near '' at line 1"},
		{"CREATE RESOURCE GROUP x PRIORITY=HIGHT", 1064, "near 'HIGHT'"},
		{"create resource group x ru_per_sec=1000 ru_per_sec=200", 1064, "near 'ru_per_sec=200'"},
		{"create resource group x burstable, burstable", 1064, "near 'burstable'"},
		{"create resource group x ru_per_sec=1000 burstable QUERY_LIMIT=(EXEC_ELAPSED='15s' action kill action cooldown)", 1064, "near 'action cooldown)'"},
		{"create resource group x ru_per_sec=1000 QUERY_LIMIT=(EXEC_ELAPSED='15s' action kil)", 1064, "near 'kil)'"},
		{"create resource group x ru_per_sec=1000 EXEC_ELAPSED='15s' action kill", 1064, "near 'EXEC_ELAPSED"},
		{"create resource group x ru_per_sec=1000 QUERY_LIMIT=(action kill)", 1105, "QUERY_LIMIT needs a limit, EXEC_ELAPSED or RU, besides its ACTION"},
		{"create resource group x ru_per_sec=-5", 1105, "RU_PER_SEC = -5 is out of range; RU_PER_SEC is 1 to 1000000000000000, or UNLIMITED"},
		{"alter resource group x ru_per_sec = - 5", 1105, "RU_PER_SEC = -5 is out of range"},
		{"create resource group x ru_per_sec=-", 1064, "near '-'"},
		{"create resource group x ru_per_sec=1000 QUERY_LIMIT=(EXEC_ELAPSED='15s')", 1105, "unknown resource group runaway action"},
		{"create resource group x ru_per_sec=1000 QUERY_LIMIT=(EXEC_ELAPSED='15d' action kill)", 1105, "EXEC_ELAPSED = '15d' is not a duration such as '60s' or '10m'; EXEC_ELAPSED is 1ms to 168h in whole milliseconds"},
		{"create resource group x ru_per_sec=1000 QUERY_LIMIT=(EXEC_ELAPSED='-1s' action kill)", 1105, "invalid exec elapsed time"},
		{"create resource group x ru_per_sec=1000 QUERY_LIMIT=(EXEC_ELAPSED=15 action kill)", 1064, "near '15 action"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(RU=0 action kill)", 1105, "QUERY_LIMIT RU = 0 is out of range; QUERY_LIMIT RU is 1 to 1000000000000000"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(RU=1000000000000001 action kill)", 1105, "QUERY_LIMIT RU = 1000000000000001 is out of range"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(EXEC_ELAPSED='1ns' action kill)", 1105, "invalid exec elapsed time: EXEC_ELAPSED = '1ns' is out of range; EXEC_ELAPSED is 1ms to 168h"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(EXEC_ELAPSED='999us' action kill)", 1105, "EXEC_ELAPSED = '999us' is out of range"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(EXEC_ELAPSED='1.5ms' action kill)", 1105, "EXEC_ELAPSED = '1.5ms' is not a whole number of milliseconds"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(EXEC_ELAPSED='168h0m0.001s' action kill)", 1105, "EXEC_ELAPSED = '168h0m0.001s' is out of range"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(EXEC_ELAPSED='9999999999h' action kill)", 1105, "EXEC_ELAPSED = '9999999999h' is not a duration"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(RU=5 action kill WATCH=EXACT DURATION='8760h1ms')", 1105, "invalid runaway watch: DURATION = '8760h1ms' is out of range; DURATION is 1ms to 8760h in whole milliseconds, or UNLIMITED"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(RU=5 action kill WATCH=EXACT DURATION='0s')", 1105, "DURATION = '0s' is out of range"},
		{"create resource group x ru_per_sec=1 max_concurrency=100001", 1105, "MAX_CONCURRENCY = 100001 is out of range; MAX_CONCURRENCY is 0 to 100000"},
		{"create resource group x ru_per_sec=1 max_concurrency=99999999999999999999", 1105, "MAX_CONCURRENCY = 99999999999999999999 is out of range"},
		{"create resource group x ru_per_sec=1000000000000001", 1105, "RU_PER_SEC = 1000000000000001 is out of range"},
		{"create resource group `a b` ru_per_sec=1", 1105, "resource group name holds U+0020 at character 2; a resource group name is 1 to 32 bytes of letters, digits, '_' and '$'"},
		{"create resource group `a\x00b` ru_per_sec=1", 1105, "U+0000 at character 2"},
		{"create resource group `a\nb` ru_per_sec=1", 1105, "U+000A at character 2"},
		{"create resource group `ab\u202e` ru_per_sec=1", 1105, "U+202E at character 3"},
		{"create resource group `a'b` ru_per_sec=1", 1105, "''' (U+0027)"},
		{"create resource group `a-b` ru_per_sec=1", 1105, "'-' (U+002D)"},
		{"create resource group `a\u200fb` ru_per_sec=1", 1105, "U+200F"},
		{"create resource group " + strings.Repeat("é", 17) + " ru_per_sec=1", 1105, "has 34 bytes; a resource group name is 1 to 32 bytes"},
		{"create resource group binding for tag k = 'a\u202eb' to rg", 1105, "invalid tag binding: the tag value holds U+202E at character 2"},
		{"create resource group binding for tag `k\tx` = 'v' to rg", 1105, "the tag key holds U+0009"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(RU=5 EXEC_ELAPSED='1s' action kill)", 1105, "only one of"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(RU=5 action kill DURATION='1m')", 1105, "DURATION needs WATCH"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(RU=5 action kill WATCH=EXACT DURATION='bad')", 1105, "invalid runaway watch"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(RU=5 action kill WATCH=PLAN)", 1235, "WATCH = PLAN"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(RU=5 action kill WATCH=FOO)", 1064, "near 'FOO)'"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(PROCESSED_KEYS=5 action kill)", 1235, "PROCESSED_KEYS"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(RU=5 action switch_group(x))", 1105, "must differ"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(RU=5 action switch_group x)", 1064, "near 'x)'"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=(RU=5 action switch_group(y)", 1064, "near ''"},
		{"create resource group x ru_per_sec=1 QUERY_LIMIT=5", 1064, "near '5'"},
		{"create resource group x ru_per_sec=0", 1105, "RU_PER_SEC = 0 is out of range"},
		{"create resource group x ru_per_sec=99999999999999999999999", 1105, "out of range"},
		{"create resource group x ru_per_sec=18446744073709551615", 1105, "out of range"},
		{"create resource group x priority=high", 1105, "unknown resource group mode"},
		{"create resource group x ru_per_sec=1 burstable=", 1064, "near ''"},
		{"create resource group x ru_per_sec=1 background=(task_types='br')", 1235, "BACKGROUND"},
		{"create resource group x cpu='8'", 1235, "raw resource mode"},
		{"create resource group " + strings.Repeat("a", 33) + " ru_per_sec=1", 1105, "resource group name too long"},
		{"create resource group 'x' ru_per_sec=1", 1064, "near ''x' ru_per_sec"},
		{"create resource group if exists x ru_per_sec=1", 1064, "near 'exists"},
		{"create resource group x ru_per_sec=1 foo", 1064, "near 'foo'"},
		{"create resource group `x ru_per_sec=1", 1064, "near '`x"},
		{"create resource group x ru_per_sec=1 /* open", 1064, "near '/* open'"},
		{"create resource group x ru_per_sec=1; drop resource group x", 1295, "prepared statement protocol"},
		{"/*!80000 create resource group x ru_per_sec=1 */", 1064, "near '/*!80000"},
		{"create resource group x ru_per_sec=1 /*M! priority=low */", 1064, "near '/*M!"},
		{"alter resource group x", 1064, "near ''"},
		{"alter resource group x query_limit=(ru=1)", 1105, "unknown resource group runaway action"},
		{"alter resource group if x ru_per_sec=1", 1064, "near 'x ru_per_sec"},
		{"alter table x add c int", 1064, "near 'table"},
		{"drop resource group", 1064, "near ''"},
		{"drop resource group x y", 1064, "near 'y'"},
		{"create resource group binding for tag route = '/r'", 1064, "near ''"},
		{"create resource group binding for tag route = '/r' to", 1064, "near ''"},
		{"create resource group binding for route = '/r' to rg", 1064, "near 'route"},
		{"create resource group binding for tag route = /r to rg", 1064, "near '/r"},
		{"create resource group binding for tag route '/r' to rg", 1064, "near ''/r'"},
		{"create resource group binding for tag = '/r' to rg", 1064, "near '= '/r'"},
		{"create resource group binding for tag '' = '/r' to rg", 1105, "the tag key is empty"},
		{"create resource group binding for tag k = '" + strings.Repeat("v", 257) + "' to rg", 1105, "longer than 256 bytes"},
		{"create resource group binding if not exists for tag k = 'v' to rg", 1064, "near 'if not"},
		{"create resource group binding for tag k = 'v' to rg extra", 1064, "near 'extra'"},
		{"drop resource group binding for tag k", 1064, "near ''"},
		{"drop resource group binding if for tag k = 'v'", 1064, "near 'for tag"},
		{"drop resource group binding for tag k = 'v' to rg", 1064, "near 'to rg'"},
		{"create resource group binding for digest '00ab' to rg", 1105, "invalid digest binding: the digest is 4 bytes long; a digest is the 16 hex digits"},
		{"create resource group binding for digest '00ab34cd56ef789g' to rg", 1105, "the digest holds 'g' (U+0067) at character 16"},
		{"create resource group binding for digest '00ab34cd56ef789\xe9' to rg", 1105, "the digest holds the byte 0xE9 at character 16"},
		{"create resource group binding for digest ' 0ab34cd56ef7890' to rg", 1105, "the digest holds U+0020 at character 1"},
		{"create resource group binding for digest '' to rg", 1105, "the digest is 0 bytes long"},
		{"create resource group binding for digest 00ab34cd56ef7890 to rg", 1064, "expected the digest as a quoted string of 16 hex digits"},
		{"create resource group binding for digest `00ab34cd56ef7890` to rg", 1064, "expected the digest as a quoted string"},
		{"create resource group binding for digest '00ab34cd56ef7890'", 1064, "expected TO"},
		{"create resource group binding for digest '00ab34cd56ef7890' to 'rg'", 1064, "quote a name with backquotes"},
		{"create resource group binding for sql '00ab34cd56ef7890' to rg", 1064, "expected TAG or DIGEST, not 'sql'"},
		{"drop resource group binding for digest '00ab34cd56ef7890' to rg", 1064, "near 'to rg'"},
		{"drop resource group binding for digest", 1064, "not the end of the statement"},
		{"create session binding for select 1 using select 1", 1235, "SESSION bindings"},
		{"create global binding for select 1", 1064, "CREATE BINDING needs USING"},
		{"create global binding", 1064, "expected FOR or USING, not the end of the statement"},
		{"create global binding for using select 1", 1064, "expected a statement after FOR"},
		{"drop binding using select 1", 1064, "expected FOR, not 'using'"},
		{"drop binding for sql digest 'abc'", 1105, "the digest is 3 bytes long"},
		{"DROP BINDING FOR SQL DIGEST", 1064, "expected the digest as a quoted string"},
		{"create binding for select 1 using /*! select 1 */", 1064, "executable comments"},
		{"alter user app resource group", 1064, "near ''"},
		{"alter user app@ resource group rg", 1064, "near 'group rg'"},
		{"alter user app@1.2.3.4 resource group rg x", 1064, "near 'x'"},
		{"alter user app@10. resource group rg", 1064, "near '@10. resource group rg'"},
		{"alter user app@10.= resource group rg", 1064, "near '@10.= resource"},
		{"alter user app@= resource group rg", 1064, "near '= resource"},
		{"alter user = resource group rg", 1064, "near '= resource"},
		{"alter user app identified by 'x'", 1064, "near 'identified"},
		{"set resource group", 1064, "near ''"},
		{"set resource x", 1064, "near 'x'"},
		{"show create resource group", 1064, "near ''"},
		{"show resource group", 1064, "near ''"},
		{"show last statement", 1064, "near ''"},
		{"show tables", 1064, "near 'tables'"},
		{"select current_resource_group(", 1064, "near ''"},
		{"select current_resource_group(), 1", 1235, "CURRENT_RESOURCE_GROUP() in a larger query"},
		{"select count(*) from information_schema.resource_groups", 1235, "information_schema.resource_groups"},
		{"select name from information_schema.resource_groups order by name", 1235, "use SELECT *"},
		{"select * from information_schema.resource_groups where ru_per_sec = 1", 1235, "use SELECT *"},
		{"select * from information_schema.resource_groups where name = 1", 1235, "use SELECT *"},
		{"select * from information_schema.resource_groups where name like 'x'", 1235, "use SELECT *"},
		{"select * from information_schema.tables", 1235, "use SELECT *"},
		{"select * from information_schema", 1235, "use SELECT *"},
		{"select * from mysql.user", 1235, "use SELECT *"},
		{"select *, name from information_schema.resource_groups", 1235, "use SELECT *"},
		{"select name, from information_schema.resource_groups", 1235, "use SELECT *"},
		{"select * from information_schema.resource_groups where name = 'y", 1064, "near ''y'"},
		{"update t set a=1", 1064, "near 'update"},
		{"", 1064, "near '' at line 1"},
		{"create\nresource\ngroup x ru_per_sec = !", 1064, "near '!' at line 3"},
	}
	checkParseErrors(t, tests)
}

// parseErrorCase is a statement Parse refuses, with the MySQL code and a
// substring of the message it must refuse it with.
type parseErrorCase = struct {
	sql  string
	code uint16
	msg  string // substring of the message
}

// checkParseErrors runs each case through Parse.
func checkParseErrors(t *testing.T, tests []parseErrorCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.sql, func(t *testing.T) {
			st, err := Parse(tt.sql, sqltext.Mode{})
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse = %#v, %v; want an *Error", st, err)
			}
			if e.Code != tt.code || !strings.Contains(e.Message, tt.msg) {
				t.Errorf("Parse error = %d %q, want %d containing %q", e.Code, e.Message, tt.code, tt.msg)
			}
		})
	}
}

func TestApply(t *testing.T) {
	old := Group{Name: "rg", RUPerSec: 10, Priority: PriorityHigh, Burst: BurstModerated,
		QueryLimit: &QueryLimit{RU: 5, Action: ActionKill}, Version: 7}
	tests := []struct {
		sql  string
		want Group
	}{
		{"alter resource group rg ru_per_sec=20", Group{Name: "rg", RUPerSec: 20, Priority: PriorityHigh, Burst: BurstModerated, QueryLimit: &QueryLimit{RU: 5, Action: ActionKill}, Version: 7}},
		{"alter resource group rg priority=low burstable=off", Group{Name: "rg", RUPerSec: 10, Priority: PriorityLow, QueryLimit: &QueryLimit{RU: 5, Action: ActionKill}, Version: 7}},
		{"alter resource group rg query_limit=null", Group{Name: "rg", RUPerSec: 10, Priority: PriorityHigh, Burst: BurstModerated, Version: 7}},
		{"alter resource group rg query_limit=(exec_elapsed='1s' action=cooldown)", Group{Name: "rg", RUPerSec: 10, Priority: PriorityHigh, Burst: BurstModerated, QueryLimit: &QueryLimit{ExecElapsed: time.Second, Action: ActionCooldown}, Version: 7}},
	}
	for _, tt := range tests {
		st, err := Parse(tt.sql, sqltext.Mode{})
		if err != nil {
			t.Fatal(err)
		}
		a := st.(*AlterGroup)
		got := a.Apply(old)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s:\n got  %+v %+v\n want %+v %+v", tt.sql, got, got.QueryLimit, tt.want, tt.want.QueryLimit)
		}
		if got.QueryLimit != nil && got.QueryLimit == old.QueryLimit {
			t.Errorf("%s: Apply shares the old QueryLimit", tt.sql)
		}
		if got.QueryLimit != nil && got.QueryLimit == a.Options.QueryLimit {
			t.Errorf("%s: Apply shares the statement's QueryLimit", tt.sql)
		}
	}
	if old.RUPerSec != 10 || old.QueryLimit.RU != 5 {
		t.Errorf("Apply modified its input: %+v", old)
	}
}

func TestStatementKinds(t *testing.T) {
	tests := []struct {
		sql          string
		super, bound bool
	}{
		{"create resource group x ru_per_sec=1", true, false},
		{"alter resource group x ru_per_sec=1", true, false},
		{"drop resource group x", true, false},
		{"alter user u resource group x", true, false},
		{"create resource group binding for tag k = 'v' to x", true, false},
		{"drop resource group binding for tag k = 'v'", true, false},
		{"set resource group x", false, true},
		{"select current_resource_group()", false, true},
		{"show resource group usage", false, true},
		{"show last statement ru", false, true},
		{"show create resource group x", false, false},
		{"select * from information_schema.resource_groups", false, false},
	}
	for _, tt := range tests {
		st, err := Parse(tt.sql, sqltext.Mode{})
		if err != nil {
			t.Fatal(err)
		}
		if RequiresSuper(st) != tt.super || IsSessionBound(st) != tt.bound {
			t.Errorf("%s: RequiresSuper=%v IsSessionBound=%v, want %v %v", tt.sql, RequiresSuper(st), IsSessionBound(st), tt.super, tt.bound)
		}
	}
}

// A syntax error says why after MySQL's text, and points at the token.
func TestSyntaxSaysWhy(t *testing.T) {
	tests := []struct{ sql, near, why string }{
		{"CREATE RESOURCE GROUP t6", "", "CREATE RESOURCE GROUP needs at least one option (RU_PER_SEC, PRIORITY, BURSTABLE, QUERY_LIMIT, MODE, MAX_CONCURRENCY, BUDGET, PARENT, BACKGROUND) after `t6`"},
		{"CREATE RESOURCE GROUP t6;", ";", "CREATE RESOURCE GROUP needs at least one option"},
		{"ALTER RESOURCE GROUP t6", "", "ALTER RESOURCE GROUP needs at least one option"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SECOND = 10", "RU_PER_SECOND = 10", "unknown option 'RU_PER_SECOND'; the options are RU_PER_SEC,"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 10 FOO = 1", "FOO = 1", "unknown option 'FOO'"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 10 = 5", "= 5", "expected an option (RU_PER_SEC,"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 'ten'", "'ten'", "RU_PER_SEC is a whole number or UNLIMITED without quotes, not 'ten'"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = lots", "lots", "RU_PER_SEC is a whole number or UNLIMITED, not 'lots'"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 RU_PER_SEC = 2", "RU_PER_SEC = 2", "RU_PER_SEC is given twice"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 PRIORITY = URGENT", "URGENT", "PRIORITY is LOW, MEDIUM or HIGH, not 'URGENT'"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 BURSTABLE = YES", "YES", "BURSTABLE is MODERATED, UNLIMITED or OFF"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 MODE = STRICT", "STRICT", "MODE is ENFORCE, WARN or OFF, not 'STRICT'"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 MAX_CONCURRENCY = many", "many", "MAX_CONCURRENCY is a whole number or NULL"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 QUERY_LIMIT = EXEC_ELAPSED = '1s'", "EXEC_ELAPSED = '1s'", "QUERY_LIMIT is NULL or ("},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 QUERY_LIMIT = (EXEC_ELAPSED = 60, ACTION = KILL)", "60, ACTION = KILL)", "EXEC_ELAPSED is a quoted duration such as '60s'"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 QUERY_LIMIT = (EXEC_ELAPSED = '1s', ACTION = STOP)", "STOP)", "ACTION is DRYRUN, COOLDOWN, KILL or SWITCH_GROUP(group), not 'STOP'"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 QUERY_LIMIT = (ELAPSED = '1s', ACTION = KILL)", "ELAPSED = '1s', ACTION = KILL)", "unknown QUERY_LIMIT option 'ELAPSED'; its options are EXEC_ELAPSED, RU, ACTION, WATCH, DURATION"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 QUERY_LIMIT = (EXEC_ELAPSED = '1s', ACTION = KILL", "", "QUERY_LIMIT's ( is not closed"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 QUERY_LIMIT = (EXEC_ELAPSED = '1s', ACTION = KILL, WATCH = ALL)", "ALL)", "WATCH is EXACT or SIMILAR"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 QUERY_LIMIT = (EXEC_ELAPSED = '1s', ACTION = KILL, WATCH = EXACT DURATION = 10)", "10)", "DURATION is a quoted duration such as '60s' or '10m' or UNLIMITED"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 QUERY_LIMIT = (RU = 1, ACTION = KILL, RU = 2)", "RU = 2)", "QUERY_LIMIT's RU is given twice"},
		{"CREATE RESOURCE GROUP 't6' RU_PER_SEC = 1", "'t6' RU_PER_SEC = 1", "expected a resource group name, not the string 't6'"},
		{"CREATE RESOURCE GROUPS t6 RU_PER_SEC = 1", "GROUPS t6 RU_PER_SEC = 1", "expected GROUP, not 'GROUPS'"},
		{"CREATE RESOURCE GROUP BINDING FOR TAG route '/r' TO t6", "'/r' TO t6", "expected '=', not '/r'"},
		{"SET RESOURCE GROUP a b", "b", "expected the end of the statement, not 'b'"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 1 /* open", "/* open", "a quote or comment is not closed"},
	}
	for _, tc := range tests {
		_, err := Parse(tc.sql, sqltext.Mode{})
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeSyntax {
			t.Errorf("%s: %v, want 1064", tc.sql, err)
			continue
		}
		want := "near '" + tc.near + "' at line 1: "
		if !strings.HasPrefix(e.Message, "You have an error in your SQL syntax; ") || !strings.Contains(e.Message, want+tc.why) {
			t.Errorf("%s:\n got  %s\n want ...%s%s...", tc.sql, e.Message, want, tc.why)
		}
	}
}
