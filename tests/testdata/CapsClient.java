import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Arrays;

/**
 * CapsClient drives MariaDB Connector/J (Debian's libmariadb-java) for
 * rgproxy's end-to-end tests (tests/caps_test.go) and for make bench-proxy
 * (scripts/bench-proxy.sh). It runs as a single source file:
 *
 * <pre>
 * java -cp /usr/share/java/mariadb-java-client.jar CapsClient.java MODE HOST:PORT TABLE [ROWS]
 *   check  a batch insert of ROWS rows (COM_STMT_BULK_EXECUTE), then a
 *          prepared SELECT executed twice; prints what the driver returns
 *   ru     a batch insert of ROWS rows, then SHOW LAST STATEMENT RU on the
 *          same connection (through a metering rgproxy)
 *   bench  a batch insert of ROWS rows, once to warm up, then ITER times
 *          (default 5) on an emptied table; prints the seconds of each
 * </pre>
 *
 * The table is created in rgproxy_e2e, or the database the system property
 * db names (-Ddb=...), dropped first and dropped at the end.
 */
public class CapsClient {
    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: CapsClient check|ru|bench HOST:PORT TABLE [ROWS [ITER]]");
            System.exit(2);
        }
        String mode = args[0], addr = args[1], table = args[2];
        int rows = args.length > 3 ? Integer.parseInt(args[3]) : 50;
        int iterations = args.length > 4 ? Integer.parseInt(args[4]) : 5;
        String url = "jdbc:mariadb://" + addr + "/" + System.getProperty("db", "rgproxy_e2e")
                + "?user=root&useServerPrepStmts=true&useBulkStmts=true";
        try (Connection c = DriverManager.getConnection(url)) {
            try (Statement s = c.createStatement()) {
                s.execute("DROP TABLE IF EXISTS " + table);
                s.execute("CREATE TABLE " + table
                        + " (id INT PRIMARY KEY, j JSON, u UUID, i6 INET6, v VARCHAR(64))");
            }
            if (mode.equals("bench")) {
                for (int i = 0; i <= iterations; i++) {
                    long start = System.nanoTime();
                    int[] counts = batchInsert(c, table, rows);
                    double seconds = (System.nanoTime() - start) / 1e9;
                    if (i > 0) {
                        System.out.printf("seconds=%.4f rows=%d counts=%s%n", seconds, counts.length, summary(counts));
                    }
                    try (Statement s = c.createStatement()) {
                        s.execute("TRUNCATE TABLE " + table);
                    }
                }
            }
            int[] counts = mode.equals("bench") ? new int[0] : batchInsert(c, table, rows);
            switch (mode) {
                case "check":
                    System.out.println("batch " + counts.length + " rows, update counts " + summary(counts));
                    select(c, table);
                    break;
                case "ru":
                    System.out.println("batch " + counts.length + " rows, update counts " + summary(counts));
                    try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SHOW LAST STATEMENT RU")) {
                        print(rs);
                    }
                    break;
                case "bench":
                    break;
                default:
                    throw new IllegalArgumentException("unknown mode " + mode);
            }
            try (Statement s = c.createStatement()) {
                s.execute("DROP TABLE " + table);
            }
        } catch (SQLException e) {
            System.out.println("error " + e.getErrorCode() + " " + e.getSQLState() + ": " + e.getMessage());
            System.exit(1);
        }
    }

    /** batchInsert inserts rows rows with executeBatch, which Connector/J sends as one bulk. */
    static int[] batchInsert(Connection c, String table, int rows) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement("INSERT INTO " + table + " VALUES (?, ?, ?, ?, ?)")) {
            for (int i = 0; i < rows; i++) {
                ps.setInt(1, i);
                ps.setString(2, "{\"n\": " + i + ", \"s\": \"\u00e9\\u263a\"}");
                ps.setString(3, String.format("%08x-1111-2222-3333-%012x", i, i));
                ps.setString(4, "2001:db8::" + Integer.toHexString(i));
                ps.setString(5, "row " + i);
                ps.addBatch();
            }
            return ps.executeBatch();
        }
    }

    /** select runs one prepared statement twice (its metadata known the second time). */
    static void select(Connection c, String table) throws SQLException {
        String q = "SELECT id, j, u, i6, v, JSON_EXTRACT(j, '$.s') AS e FROM " + table + " WHERE id >= ? ORDER BY id LIMIT 5";
        try (PreparedStatement ps = c.prepareStatement(q)) {
            for (int from : new int[] {0, 3}) {
                ps.setInt(1, from);
                try (ResultSet rs = ps.executeQuery()) {
                    System.out.println("execute from " + from + ":");
                    print(rs);
                }
            }
        }
    }

    /** print writes a result set: its columns' metadata, then each row. */
    static void print(ResultSet rs) throws SQLException {
        ResultSetMetaData md = rs.getMetaData();
        StringBuilder sb = new StringBuilder();
        for (int i = 1; i <= md.getColumnCount(); i++) {
            sb.append(i > 1 ? " | " : "").append(md.getColumnLabel(i)).append(' ').append(md.getColumnTypeName(i))
                    .append(' ').append(md.getColumnClassName(i)).append(' ').append(md.getPrecision(i));
        }
        System.out.println("  columns: " + sb);
        while (rs.next()) {
            sb.setLength(0);
            for (int i = 1; i <= md.getColumnCount(); i++) {
                Object o = rs.getObject(i);
                sb.append(i > 1 ? " | " : "").append(o == null ? "NULL" : o.getClass().getSimpleName() + ":" + o);
            }
            System.out.println("  row: " + sb);
        }
    }

    /** summary condenses update counts: Connector/J answers -2 (SUCCESS_NO_INFO) for a bulk. */
    static String summary(int[] counts) {
        return Arrays.stream(counts).distinct().sorted().boxed().toList().toString();
    }
}
