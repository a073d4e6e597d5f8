"""SQLAlchemy 2 as Superset and ORM users use it: create_engine, the inspector, reflection,
an ORM query over a materialized view, nested transactions. Prints one JSON document."""
import json
import sys

from sqlalchemy import Column, Integer, MetaData, Numeric, String, Table, create_engine, inspect, select, text
from sqlalchemy.orm import DeclarativeBase, Session


class Base(DeclarativeBase):
    pass


class CustomerTotal(Base):
    __tablename__ = "customer_totals"
    customer = Column(String, primary_key=True)
    total = Column(Numeric)
    orders = Column(Integer)


def main(url):
    url = url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url)
    out = {}
    with engine.connect() as conn:
        out["select_1"] = conn.execute(text("SELECT 1")).scalar()
    inspector = inspect(engine)
    out["schemas"] = sorted(s for s in inspector.get_schema_names() if s not in ("information_schema",))
    out["tables"] = sorted(inspector.get_table_names())
    out["views"] = sorted(inspector.get_view_names())
    out["materialized_views"] = sorted(inspector.get_materialized_view_names())
    pk = inspector.get_pk_constraint("orders")
    out["pk"] = {"columns": pk["constrained_columns"], "name": pk["name"]}
    out["columns"] = [
        {"name": c["name"], "type": str(c["type"]), "nullable": c["nullable"], "default": c["default"]} for c in inspector.get_columns("orders")
    ]
    out["mv_columns"] = [{"name": c["name"], "type": str(c["type"])} for c in inspector.get_columns("customer_totals")]
    orders = Table("orders", MetaData(), autoload_with=engine)
    out["reflected"] = [(c.name, str(c.type)) for c in orders.columns]
    out["reflected_pk"] = [c.name for c in orders.primary_key]
    with Session(engine) as session:
        rows = session.scalars(select(CustomerTotal).where(CustomerTotal.total > 1).order_by(CustomerTotal.customer)).all()
        out["orm"] = [[r.customer, str(r.total), r.orders] for r in rows]
    with Session(engine) as session:
        with session.begin():
            session.execute(text("INSERT INTO orders VALUES (300, 'orm', 1.25)"))
            nested = session.begin_nested()
            session.execute(text("INSERT INTO orders VALUES (301, 'orm', 2.50)"))
            nested.rollback()
    with Session(engine) as session:
        out["after_nested"] = session.execute(text("SELECT id FROM orders WHERE id >= 300 ORDER BY id")).scalars().all()
    print(json.dumps(out, indent=1, sort_keys=True, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
