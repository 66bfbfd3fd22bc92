"""bench/sass.py on the CPU: the cubin padding and the opcode count (no nvdisasm needed)."""

import pytest

from bench import sass


def _elf(phoff, phnum, shoff, shnum, size):
    head = bytearray(64)
    head[:4] = b"\x7fELF"
    head[32:40] = phoff.to_bytes(8, "little")
    head[40:48] = shoff.to_bytes(8, "little")
    head[54:56] = (56).to_bytes(2, "little")
    head[56:58] = phnum.to_bytes(2, "little")
    head[58:60] = (64).to_bytes(2, "little")
    head[60:62] = shnum.to_bytes(2, "little")
    return bytes(head) + bytes(size - 64)


def test_a_short_image_is_padded_to_its_program_headers():
    whole = _elf(phoff=1000, phnum=6, shoff=200, shnum=10, size=1000 + 6 * 56)
    assert sass.cubin_image(whole[:-1]) == whole
    assert sass.cubin_image(whole) == whole
    with pytest.raises(ValueError, match="ELF"):
        sass.cubin_image(b"not elf" + bytes(80))


def test_opcodes_drop_predicates_and_modifiers():
    listing = ("        /*0400*/                   BRA.DIV UR6, `(.L_x_2) ;\n"
               "        /*0410*/                   SHFL.IDX PT, R9, R4, R27, 0x1f ;\n"
               "        /*0880*/               @P1 LDG.E R30, desc[UR4][R36.64] ;\n"
               "        /*0890*/              @!PT LDG.E R31, desc[UR4][R36.64] ;\n")
    assert sass.opcodes(listing) == {"BRA": 1, "SHFL": 1, "LDG": 2}
