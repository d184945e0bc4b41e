"""Documents for attachment tests, written byte by byte: a PDF with a text layer, long texts, images."""

from __future__ import annotations

import io
from pathlib import Path


def write_pdf(path: Path, pages: list[str]) -> Path:
    """A real PDF 1.4 (one Helvetica text line per page), with its cross-reference table: what pypdf,
    pdfminer and viewers read."""
    objects: list[bytes] = []
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(len(pages)))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    font = 3 + 2 * len(pages)
    for i, text in enumerate(pages):
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET".encode()
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R"
            f" /Resources << /Font << /F1 {font} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    path.write_bytes(out.getvalue())
    return path


def long_text(pages: int, lines_per_page: int = 50) -> str:
    """A book of ``pages`` pages of distinct numbered lines (about 60 characters each)."""
    return "".join(
        f"Page {p:4} line {n:2}: the quick brown fox jumps over the lazy dog.\n"
        for p in range(1, pages + 1)
        for n in range(1, lines_per_page + 1)
    )


def write_image(path: Path, width: int, height: int, fmt: str = "PNG") -> Path:
    from PIL import Image

    image = Image.new("RGB", (width, height))
    for x in range(0, width, max(1, width // 16)):  # stripes: not one colour, so encoders do real work
        for y in range(height):
            image.putpixel((x, y), (255, x % 256, y % 256))
    image.save(path, fmt)
    return path
