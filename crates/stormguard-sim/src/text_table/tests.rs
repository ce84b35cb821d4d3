use super::*;

#[test]
fn pads_headers_and_cells_and_appends_the_series() {
    let mut table = TextTable::new("T", vec![Column::left("name", 6), Column::right("n", 4)])
        .with_series("per second");
    table.row_with_series(vec!["a".into(), fixed(1.5, 1)], &[1.0, 0.5]);
    assert_eq!(
        table.to_string(),
        "T\nname   |    n | per second\na      |  1.5 | 100  50\n"
    );
}

#[test]
fn a_cell_wider_than_its_column_is_printed_whole() {
    let mut table = TextTable::new("T", vec![Column::right("x", 2)]);
    table.row(vec![percent(0.123_45, 3)]);
    assert_eq!(table.to_string(), "T\n x\n12.345%\n");
}
