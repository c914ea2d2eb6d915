"""Token strings that would break a page if a view did not escape them."""

PLANTED = {
    5: "</script><script>document.title='PWNED-script'</script>",
    6: "<img src=x onerror=\"document.title='PWNED-img'\">",
    7: 'a & b "quoted" \'single\'',
    8: "&lt;not an entity",
    9: "<!--",
}


def planted_str(i: int) -> str:
    return PLANTED.get(i, f"t{i}")
