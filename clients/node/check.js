// node-postgres as its users use it: typed results (int4 as a number, int8 and numeric as
// strings), arrays as JS arrays, jsonb as objects, parameters, a pool, errors with codes.
// Prints one JSON document.
const { Client, Pool } = require('pg');

async function main(url) {
  const out = {};
  const client = new Client({ connectionString: url });
  await client.connect();
  const r = await client.query("SELECT 1 AS one, 2147483648 AS big, 1.5 AS dec, 'x'::varchar AS v, true AS b, count(*) AS n FROM orders");
  out.literals = Object.fromEntries(Object.entries(r.rows[0]).map(([k, v]) => [k, [typeof v, v]]));
  out.fields = r.fields.map((f) => [f.name, f.dataTypeID]);
  const a = await client.query("SELECT ARRAY[1,2,3] AS ints, ARRAY['a', NULL, 'b c'] AS texts, tags FROM tagged WHERE id = 1");
  out.arrays = a.rows[0];
  const j = await client.query(`SELECT jsonb_build_object('a', 1, 'b', ARRAY[1,2]) AS doc, '{"x": {"y": 2}}'::jsonb -> 'x' AS sub`);
  out.jsonb = j.rows[0];
  const p = await client.query('SELECT id, customer, amount FROM orders WHERE id = ANY($1::int[]) ORDER BY id', [[1, 3]]);
  out.params = p.rows;
  const typed = await client.query({ text: 'SELECT customer, total FROM customer_totals ORDER BY customer', rowMode: 'array' });
  out.view_rows = typed.rows;
  try {
    await client.query('SELECT * FROM no_such_table');
  } catch (e) {
    out.error = [e.code, e.message];
  }
  await client.end();
  const pool = new Pool({ connectionString: url, max: 3 });
  const counts = await Promise.all([1, 2, 3, 4, 5].map((i) => pool.query('SELECT $1::int * 2 AS twice', [i])));
  out.pool = counts.map((c) => c.rows[0].twice);
  await pool.end();
  console.log(JSON.stringify(out, null, 1));
}

main(process.argv[2]).catch((e) => {
  console.error(e);
  process.exit(1);
});
