-- Table definitions of the pg-tiny capture, from catalog.json (PostgreSQL's own catalog).
CREATE TABLE public.pgbench_accounts (
    aid integer NOT NULL,
    bid integer,
    abalance integer,
    filler character(84),
    PRIMARY KEY (aid)
);
CREATE TABLE public.pgbench_branches (
    bid integer NOT NULL,
    bbalance integer,
    filler character(88),
    PRIMARY KEY (bid)
);
CREATE TABLE public.pgbench_history (
    tid integer,
    bid integer,
    aid integer,
    delta integer,
    mtime timestamp without time zone,
    filler character(22),
    hid bigint NOT NULL,
    PRIMARY KEY (hid)
);
CREATE TABLE public.pgbench_tellers (
    tid integer NOT NULL,
    bid integer,
    tbalance integer,
    filler character(84),
    PRIMARY KEY (tid)
);
CREATE TABLE tpcc.customer (
    c_w_id integer NOT NULL,
    c_d_id smallint NOT NULL,
    c_id integer NOT NULL,
    c_last character varying(16) NOT NULL,
    c_credit character(2) NOT NULL,
    c_balance numeric(12,2) NOT NULL,
    c_ytd_payment numeric(12,2) NOT NULL,
    c_payment_cnt integer NOT NULL,
    c_delivery_cnt integer NOT NULL,
    c_since timestamp with time zone NOT NULL,
    c_data text,
    PRIMARY KEY (c_w_id, c_d_id, c_id)
);
CREATE TABLE tpcc.district (
    d_w_id integer NOT NULL,
    d_id smallint NOT NULL,
    d_name character varying(10) NOT NULL,
    d_tax numeric(4,4) NOT NULL,
    d_ytd numeric(12,2) NOT NULL,
    d_next_o_id integer NOT NULL,
    PRIMARY KEY (d_w_id, d_id)
);
CREATE TABLE tpcc.history (
    h_id bigint NOT NULL,
    h_c_id integer,
    h_c_d_id smallint,
    h_c_w_id integer,
    h_d_id smallint,
    h_w_id integer,
    h_date date NOT NULL,
    h_amount numeric(6,2),
    h_data character varying(24),
    h_ratio double precision,
    PRIMARY KEY (h_id)
);
CREATE TABLE tpcc.item (
    i_id integer NOT NULL,
    i_name character varying(24) NOT NULL,
    i_price numeric(5,2) NOT NULL,
    i_data character varying(50),
    PRIMARY KEY (i_id)
);
CREATE TABLE tpcc.new_order (
    no_w_id integer NOT NULL,
    no_d_id smallint NOT NULL,
    no_o_id integer NOT NULL,
    PRIMARY KEY (no_w_id, no_d_id, no_o_id)
);
CREATE TABLE tpcc.order_line (
    ol_w_id integer NOT NULL,
    ol_d_id smallint NOT NULL,
    ol_o_id integer NOT NULL,
    ol_number smallint NOT NULL,
    ol_i_id integer NOT NULL,
    ol_delivery_d timestamp without time zone,
    ol_quantity smallint NOT NULL,
    ol_amount numeric(6,2) NOT NULL,
    ol_dist_info character(24) NOT NULL,
    PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number)
);
CREATE TABLE tpcc.orders (
    o_w_id integer NOT NULL,
    o_d_id smallint NOT NULL,
    o_id integer NOT NULL,
    o_c_id integer NOT NULL,
    o_entry_d timestamp with time zone NOT NULL,
    o_carrier_id smallint,
    o_ol_cnt smallint NOT NULL,
    o_all_local boolean NOT NULL,
    PRIMARY KEY (o_w_id, o_d_id, o_id)
);
CREATE TABLE tpcc.stock (
    s_w_id integer NOT NULL,
    s_i_id integer NOT NULL,
    s_quantity smallint NOT NULL,
    s_ytd bigint NOT NULL,
    s_order_cnt integer NOT NULL,
    s_remote_cnt integer NOT NULL,
    PRIMARY KEY (s_w_id, s_i_id)
);
CREATE TABLE tpcc.warehouse (
    w_id integer NOT NULL,
    w_name character varying(10) NOT NULL,
    w_tax numeric(4,4) NOT NULL,
    w_ytd numeric(12,2) NOT NULL,
    PRIMARY KEY (w_id)
);
