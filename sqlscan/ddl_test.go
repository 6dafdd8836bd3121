package sqlscan

import (
	"reflect"
	"testing"
)

func TestEventDDL(t *testing.T) {
	for _, tt := range []struct {
		q    string
		m    Mode
		want bool
	}{
		{"CREATE EVENT e ON SCHEDULE EVERY 1 SECOND DO INSERT INTO t VALUES (1)", Mode{}, true},
		{"create or replace event e on schedule every 1 second do select 1", Mode{}, true},
		{"CREATE DEFINER = `u`@`%` EVENT e ON SCHEDULE AT NOW() DO SELECT 1", Mode{}, true},
		{"CREATE DEFINER='u'@'localhost' EVENT IF NOT EXISTS e ON SCHEDULE AT NOW() DO SELECT 1", Mode{}, true},
		{"CREATE DEFINER=CURRENT_USER() EVENT e ON SCHEDULE AT NOW() DO SELECT 1", Mode{}, true},
		{"CREATE DEFINER = event@localhost PROCEDURE p() SELECT 1", Mode{}, false}, // a user named event
		{"ALTER EVENT e ENABLE", Mode{}, true},
		{"ALTER DEFINER = u EVENT e ON SCHEDULE EVERY 1 SECOND", Mode{}, true},
		{"/*!50106 CREATE EVENT e ON SCHEDULE EVERY 1 SECOND DO SELECT 1 */", Mode{}, true},
		{"SELECT 1; CREATE EVENT e ON SCHEDULE EVERY 1 SECOND DO SELECT 1", Mode{}, true},
		{"PREPARE s FROM 'CREATE EVENT e ON SCHEDULE EVERY 1 SECOND DO SELECT 1'", Mode{}, true},
		{"PREPARE `s` FROM 'ALTER EVENT e ENABLE'", Mode{}, true},
		{"EXECUTE IMMEDIATE 'CREATE EVENT e ON SCHEDULE EVERY 1 SECOND DO SELECT 1'", Mode{}, true},
		{"EXECUTE IMMEDIATE 'EXECUTE IMMEDIATE ''CREATE EVENT e ON SCHEDULE AT NOW() DO SELECT 1'''", Mode{}, true},
		{"CREATE PROCEDURE p() BEGIN ALTER EVENT e ENABLE; END", Mode{}, true},
		{"DROP EVENT e", Mode{}, false},
		{"SELECT * FROM information_schema.EVENTS", Mode{}, false},
		{"INSERT INTO log VALUES ('CREATE EVENT e')", Mode{}, false},
		{"CREATE TABLE event (a INT)", Mode{}, false},
		{"CREATE TABLE t (event INT)", Mode{}, false},
		{"SELECT 'CREATE EVENT' -- CREATE EVENT\n", Mode{}, false},
		// sjis: 0x95 0x5c is one character, so the literal ends after it;
		// elsewhere \' escapes the quote and the literal goes on.
		{"SELECT '\x95\\' CREATE EVENT e ON SCHEDULE AT NOW() DO SELECT 1 '", Mode{Charset: SJIS}, true},
		{"SELECT '\x95\\' CREATE EVENT e ON SCHEDULE AT NOW() DO SELECT 1 '", Mode{}, false},
		// NO_BACKSLASH_ESCAPES: the literal ends at 'C:\'.
		{`SELECT 'C:\', 'x' ; CREATE EVENT e ON SCHEDULE AT NOW() DO SELECT 1`, Mode{NoBackslashEscapes: true}, true},
	} {
		if got := EventDDL(tt.q, tt.m); got != tt.want {
			t.Errorf("EventDDL(%q, %+v) = %v, want %v", tt.q, tt.m, got, tt.want)
		}
	}
}

func TestReadCopyDDL(t *testing.T) {
	tbl := func(s, n string) []Table { return []Table{{Schema: s, Table: n}} }
	for _, tt := range []struct {
		q    string
		want CopyDDL
		ok   bool
	}{
		{"ALTER TABLE t FORCE, ALGORITHM=COPY", CopyDDL{Verb: "ALTER", Tables: tbl("", "t"), Rebuild: true}, true},
		{"ALTER TABLE t FORCE", CopyDDL{Verb: "ALTER", Tables: tbl("", "t"), Rebuild: true}, true},
		{"alter online ignore table if exists `d`.`t x` engine = InnoDB", CopyDDL{Verb: "ALTER", Tables: tbl("d", "t x"), Rebuild: true}, true},
		{"ALTER TABLE t ALGORITHM COPY, ADD COLUMN c INT", CopyDDL{Verb: "ALTER", Tables: tbl("", "t"), Rebuild: true}, true},
		{"ALTER TABLE t ADD COLUMN c INT, ALGORITHM=INSTANT", CopyDDL{Verb: "ALTER", Tables: tbl("", "t")}, true},
		{"ALTER TABLE t ADD COLUMN engine INT", CopyDDL{Verb: "ALTER", Tables: tbl("", "t")}, true},
		{"ALTER TABLE t CHANGE a engine INT", CopyDDL{Verb: "ALTER", Tables: tbl("", "t")}, true},
		{"ALTER TABLE t ADD INDEX engine (engine)", CopyDDL{Verb: "ALTER", Tables: tbl("", "t")}, true},
		{"ALTER TABLE t COMMENT 'FORCE ENGINE'", CopyDDL{Verb: "ALTER", Tables: tbl("", "t")}, true},
		{"ALTER TABLE t ADD PRIMARY KEY (id)", CopyDDL{Verb: "ALTER", Tables: tbl("", "t"), Rebuild: true}, true},
		{"ALTER TABLE t DROP PRIMARY KEY", CopyDDL{Verb: "ALTER", Tables: tbl("", "t"), Rebuild: true}, true},
		{"ALTER TABLE t CONVERT TO CHARACTER SET utf8mb4", CopyDDL{Verb: "ALTER", Tables: tbl("", "t"), Rebuild: true}, true},
		{"ALTER TABLE t ROW_FORMAT=COMPRESSED", CopyDDL{Verb: "ALTER", Tables: tbl("", "t"), Rebuild: true}, true},
		{"ALTER TABLE t PARTITION BY HASH(id) PARTITIONS 4", CopyDDL{Verb: "ALTER", Tables: tbl("", "t"), Rebuild: true}, true},
		{"ALTER TABLE t REMOVE PARTITIONING", CopyDDL{Verb: "ALTER", Tables: tbl("", "t"), Rebuild: true}, true},
		{"ALTER TABLE t DROP PARTITION p0", CopyDDL{Verb: "ALTER", Tables: tbl("", "t")}, true},
		{"ALTER TABLE t RENAME TO engine", CopyDDL{Verb: "ALTER", Tables: tbl("", "t")}, true},
		{"OPTIMIZE TABLE a, d.b", CopyDDL{Verb: "OPTIMIZE", Tables: []Table{{Table: "a"}, {Schema: "d", Table: "b"}}, Rebuild: true}, true},
		{"OPTIMIZE NO_WRITE_TO_BINLOG TABLE a", CopyDDL{Verb: "OPTIMIZE", Tables: tbl("", "a"), Rebuild: true}, true},
		{"EXECUTE IMMEDIATE 'ALTER TABLE t FORCE'", CopyDDL{Verb: "ALTER", Tables: tbl("", "t"), Rebuild: true}, true},
		{"EXECUTE IMMEDIATE 'EXECUTE IMMEDIATE ''ALTER TABLE t FORCE'''", CopyDDL{}, false},
		{"ALTER DATABASE d CHARACTER SET utf8", CopyDDL{}, false},
		{"ALTER EVENT e ENABLE", CopyDDL{}, false},
		{"SELECT 1", CopyDDL{}, false},
	} {
		got, ok := ReadCopyDDL(tt.q, Mode{})
		if ok != tt.ok || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ReadCopyDDL(%q) = %+v, %v; want %+v, %v", tt.q, got, ok, tt.want, tt.ok)
		}
	}
}

func TestDynamicVar(t *testing.T) {
	for _, tt := range []struct {
		q    string
		want string
		ok   bool
	}{
		{"PREPARE s FROM @q", "q", true},
		{"prepare `s` from @`q_1`", "q_1", true},
		{"EXECUTE IMMEDIATE @q;", "q", true},
		{"EXECUTE IMMEDIATE @'a$b'", "a$b", true},
		{"EXECUTE IMMEDIATE @q USING @a", "", false},
		{"EXECUTE IMMEDIATE CONCAT(@q, '')", "", false},
		{"PREPARE s FROM 'SELECT 1'", "", false},
		{"PREPARE s FROM @@sql_mode", "", false},
		{"EXECUTE IMMEDIATE @`a``b`", "", false},
		{"EXECUTE IMMEDIATE @`a b`", "", false},
		{"EXECUTE s", "", false},
	} {
		got, ok := DynamicVar(tt.q, Mode{})
		if got != tt.want || ok != tt.ok {
			t.Errorf("DynamicVar(%q) = %q, %v; want %q, %v", tt.q, got, ok, tt.want, tt.ok)
		}
	}
}
