// pgjdbc as DBeaver, Tableau and every JDBC tool use it: DatabaseMetaData, ResultSetMetaData,
// setFetchSize streaming (a portal fetched in pages), arrays as parameters. Prints one JSON-ish
// document of lines (compared as text).
import java.sql.*;
import java.util.*;

public class JdbcCheck {
    static void print(String key, Object value) {
        System.out.println(key + " = " + value);
    }

    public static void main(String[] args) throws Exception {
        String url = args[0];
        try (Connection conn = DriverManager.getConnection(url, args[1], "")) {
            DatabaseMetaData meta = conn.getMetaData();
            List<String> schemas = new ArrayList<>();
            try (ResultSet rs = meta.getSchemas()) {
                while (rs.next()) schemas.add(rs.getString("TABLE_SCHEM"));
            }
            schemas.removeIf(s -> s.startsWith("pg_") || s.equals("information_schema") || s.startsWith("eddy"));
            print("schemas", schemas);
            List<String> tables = new ArrayList<>();
            try (ResultSet rs = meta.getTables(null, "public", "%", new String[] {"TABLE", "VIEW", "MATERIALIZED VIEW"})) {
                while (rs.next()) tables.add(rs.getString("TABLE_NAME") + ":" + rs.getString("TABLE_TYPE"));
            }
            Collections.sort(tables);
            print("tables", tables);
            List<String> columns = new ArrayList<>();
            try (ResultSet rs = meta.getColumns(null, "public", "orders", "%")) {
                while (rs.next()) {
                    columns.add(rs.getInt("ORDINAL_POSITION") + " " + rs.getString("COLUMN_NAME") + " " + rs.getString("TYPE_NAME") + " "
                        + rs.getInt("DATA_TYPE") + " nullable=" + rs.getString("IS_NULLABLE"));
                }
            }
            print("columns", columns);
            List<String> keys = new ArrayList<>();
            try (ResultSet rs = meta.getPrimaryKeys(null, "public", "orders")) {
                while (rs.next()) keys.add(rs.getString("COLUMN_NAME") + "#" + rs.getInt("KEY_SEQ") + " " + rs.getString("PK_NAME"));
            }
            print("primary_keys", keys);

            try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery("SELECT id, customer, amount, 1 AS one, 'x'::varchar AS v FROM orders ORDER BY id")) {
                ResultSetMetaData md = rs.getMetaData();
                List<String> types = new ArrayList<>();
                for (int i = 1; i <= md.getColumnCount(); i++) types.add(md.getColumnLabel(i) + ":" + md.getColumnTypeName(i) + ":" + md.getColumnType(i));
                print("result_types", types);
            }

            // setFetchSize streams through a portal when autocommit is off.
            conn.setAutoCommit(false);
            try (PreparedStatement ps = conn.prepareStatement("SELECT id FROM orders WHERE id >= ? ORDER BY id")) {
                ps.setFetchSize(2);
                ps.setInt(1, 2);
                List<Integer> ids = new ArrayList<>();
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) ids.add(rs.getInt(1));
                }
                print("fetch_size_rows", ids);
            }
            try (PreparedStatement ps = conn.prepareStatement("SELECT count(*) FROM orders WHERE id = ANY(?)")) {
                ps.setArray(1, conn.createArrayOf("int4", new Integer[] {1, 2, 99}));
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    print("array_param_count", rs.getLong(1));
                }
            }
            try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery("SELECT tags FROM tagged WHERE id = 1")) {
                rs.next();
                print("array_column", Arrays.toString((Object[]) rs.getArray(1).getArray()));
            }
            conn.commit();
        }
    }
}
